"""Everything a connection sends leaves through its :class:`Writes`, by one of three paths:

- ``kick``, the usual one: the writer task wakes and sends all the engine queued since its last
  send in one ``send_all``, so a burst of frames costs one system call. Kicks are cheap: once a
  wake-up is pending, it carries later bytes too.
- after an input: a kick while a reader dispatches an input (``AfterInput``, one record per Trio
  run) only notes the connection; the reader writes each connection it noted through once the
  input is done (a server's replies, a gateway's relayed messages: for a gateway, a task step
  and a send saved per read).
- write-through: one non-blocking write from the task that made the bytes (the reader above, or
  a lone caller: ``AmqpConnection.send(through=True)``), no writer wake-up, whose two task steps
  and run-loop pass cost a sequential call more than the write itself. Plain TCP, writer idle,
  nothing queued before; what the socket does not take, the writer sends next, first.

They also hold the bound on bytes a peer that does not read them makes us keep
(``MAX_OUTGOING_BYTES``): counting them takes this module's own state, and a write-through must
not run while a backlog drains, since the writer is what notices the drain.
"""

from __future__ import annotations

import os
import ssl

import trio

from pairlink._amqp.connection import Connection
from pairlink._amqp.link import Link
from pairlink._io.lifecycle import ABANDONED, CLOSED, LiveConnection
from pairlink._io.plain_socket import write_nowait

MAX_OUTGOING_BYTES = 16 << 20
"""Bytes a connection may hold for a peer that is not reading them (16 MiB).

Two stages, so that a peer that does not read slows only itself: from a quarter of this on, we
grant that peer no new credit (it can send us only what it was already allowed to, so its
requests stop making replies); past all of it, which only control frames or credit granted
earlier can cause, we stop reading from it. Both end once an eighth of it is left. We keep
reading in the first stage on purpose: a peer whose own sends to us are backed up (a gateway
relaying large messages both ways) must be able to drain into us, or two honest peers that
each wait for the other to read would wait forever."""
NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)
"""What reading or writing a connection's stream raises when the network, not we, failed."""


class AfterInput:
    """The connections kicked while one input is dispatched, each written through once it is
    done, in one non-blocking write (``kicked`` is None between inputs).

    One per Trio run, found through a ``RunVar`` when a connection is made, so a connection is
    only ever noted by a reader of its own run. A blocking client runs its own Trio loop in
    another thread: its connections noted by a reader of this one would be written from the
    wrong thread, or only once that reader's input is done."""

    __slots__ = ("kicked",)

    def __init__(self) -> None:
        self.kicked: list[Writes] | None = None


_AFTER_INPUT = trio.lowlevel.RunVar[AfterInput]("pairlink.after_input")


def after_input() -> AfterInput:
    """The current Trio run's record, made on first use."""
    try:
        return _AFTER_INPUT.get()
    except LookupError:
        record = AfterInput()
        _AFTER_INPUT.set(record)
        return record


class Writes:
    """How one connection's bytes leave (see the module docstring), and how many wait."""

    def __init__(
        self,
        conn: LiveConnection,
        engine: Connection,
        stream: trio.abc.Stream,
        max_bytes: int = MAX_OUTGOING_BYTES,
    ) -> None:
        self._conn = conn
        self._engine = engine
        self._stream = stream
        tcp = stream if isinstance(stream, trio.SocketStream) and os.name == "posix" else None
        self.socket = None if tcp is None else tcp.socket
        """The plain TCP socket under ``stream``, read and written directly too; None for TLS
        or any other stream."""
        self.after = after_input()
        self.kicked = False
        """A wake-up of the writer is pending, or a write after the input: kicks need nothing."""
        self._wake, self._wakes = trio.open_memory_channel[None](1)
        self._sending = 0  # bytes handed to the socket whose send has not returned yet
        self.unsent = b""
        """The rest of a write-through the socket did not take: the writer sends it first."""
        self.max_bytes = max_bytes
        self.backlogged = False
        """The peer is behind on reading: new credit is held back (``MAX_OUTGOING_BYTES``)."""
        self.drained = trio.Event()  # set when a backlog has gone
        self.deferred_flows: dict[Link, int] = {}
        """Credit increases held back while backlogged, by link: given when the peer drained."""
        self.peer_eof = trio.Event()
        """Set by the reader at the peer's EOF (or a dead socket): hanging up resets nothing."""
        self.close_answered = False
        """The peer answered our close: it has nothing left to read, the socket may go now."""
        self.flushed = trio.Event()
        """The writer is done: its last bytes sent, the socket closed."""

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._write_loop)

    def kick(self) -> None:
        """Have what the engine queued sent: by the writer, woken unless a wake-up is pending,
        or, while an input is dispatched and over plain TCP, written through after it."""
        if self.kicked:
            return
        self.kicked = True
        after = self.after.kicked
        if after is not None and self.socket is not None:
            after.append(self)
            return
        self._wake.send_nowait(None)  # never full: the writer took the last one

    def write_through(self, now: float | None = None) -> bool:
        """One non-blocking write of what the engine queued (``now``: the caller's clock, which
        dates it for the heartbeats). False when it cannot (not plain TCP, the writer busy or
        behind, the connection over) or the socket did not take it all: the writer then sends
        the rest, and reports any error."""
        socket, engine = self.socket, self._engine
        idle = not (self._sending or self.unsent or self.backlogged)
        if socket is None or not idle or engine.transport_done or self._conn.state >= CLOSED:
            return False
        data = engine.data_to_send(trio.current_time() if now is None else now)
        sent = write_nowait(socket, data) if data else 0
        self.unsent = data[sent:]
        return not self.unsent

    # -- the writer task -------------------------------------------------------------------

    async def _write_loop(self) -> None:
        conn, engine = self._conn, self._engine
        try:
            async for _ in self._wakes:
                self.kicked = False
                # transport_done is read before the send: bytes queued while a send was in
                # progress (a SASL outcome, a close reply) still go out on the next round
                done = engine.transport_done or conn.state is ABANDONED
                data, self.unsent = self.unsent + engine.data_to_send(trio.current_time()), b""
                if data:
                    self._sending = len(data)
                    try:
                        await self._stream.send_all(data)
                    except NETWORK_ERRORS as exc:
                        conn.dispatch(engine.connection_lost(), lost=f"write failed: {exc!r}")
                        return
                    finally:
                        self._sending = 0
                    if self.backlogged:
                        self._check_drained()
                del data  # sent: not held while the writer waits (a 60 MiB reply was)
                if done:
                    break  # the engine said everything it will say: the socket can go
            await self._hang_up()
            conn.finish(conn.error)
        finally:
            self.flushed.set()

    async def _hang_up(self) -> None:
        """Close the socket. When the peer still has to read our last words (our answer to
        its close, a SASL refusal, a close for its error), give it a moment (bounded) to close
        its end first: closing with its bytes unread would reset the connection, and a reset
        can destroy our last frames before the peer reads them. When it answered our close,
        it has nothing left to read: close at once."""
        if not self.close_answered:
            with trio.move_on_after(1):
                await self.peer_eof.wait()
        await trio.aclose_forcefully(self._stream)

    def stop(self) -> None:
        """The connection is over: the writer flushes what is left (a close reply) and ends,
        and a reader waiting for the peer to drain goes on (to its EOF)."""
        self.kick()
        self.drained.set()

    # -- bytes the peer has not read (MAX_OUTGOING_BYTES) ----------------------------------

    def waiting_bytes(self) -> int:
        """What we hold for the peer: queued in the engine, and in a send not yet done."""
        return self._sending + len(self.unsent) + self._engine.output_size

    def defer_flow(self, link: Link, more: int) -> None:
        """Hold back a credit increase of ``more`` on ``link`` until the peer drained (the
        increase, not the value: what arrives meanwhile uses up the credit it had)."""
        self._hold_credit()
        self.deferred_flows[link] = more

    def _hold_credit(self) -> None:
        if not self.backlogged:
            self.backlogged = True
            self.drained = trio.Event()
            self._conn.log.info("peer.backlogged", waiting=self.waiting_bytes())

    async def wait_drained(self) -> None:
        """From the reader, past ``max_bytes``: read nothing more from this peer until it
        drained."""
        self._hold_credit()
        self._conn.log.warning("peer.not_reading", waiting=self.waiting_bytes())
        self.kick()
        await self.drained.wait()

    def _check_drained(self) -> None:
        """After a send: once the backlog is down to an eighth of the bound, give the peer the
        credit held back meanwhile, and let the reader go on."""
        if self.waiting_bytes() > self.max_bytes // 8:
            return
        self.backlogged = False
        self.drained.set()
        self._conn.log.info("peer.drained")
        flows, self.deferred_flows = self.deferred_flows, {}
        for link, more in flows.items():
            self._conn.flow(link, link.link_credit + more)
