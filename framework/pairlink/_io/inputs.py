"""What a connection's engine is fed, and by which task: the peer's bytes by the reader, the
clock by the timer. Both hand what the engine says to the connection's ``dispatch``.

The reader feeds the engine in slices, lets an ``on_attach`` hold the rest of the input until
an attach is answered (``hold``), and writes what an input gave any connection to send through
once it is dispatched (:class:`pairlink._io.writes.AfterInput`). It stops reading a peer that
does not read what we send (:meth:`pairlink._io.writes.Writes.wait_drained`), and reads on to
the peer's EOF after the engine is done.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from pairlink._amqp.connection import Connection
from pairlink._io.lifecycle import ABANDONED, CLOSED, LiveConnection
from pairlink._io.plain_socket import receive
from pairlink._io.writes import NETWORK_ERRORS, Writes

READ_SIZE = 1 << 16
FEED_SLICE = 1 << 12
"""The engine is fed at most this many bytes at a time; between slices the writer gets its
turn if the engine has replies to send. A 64 KiB read can hold hundreds of small calls: fed
whole, the peer waited for all of them to be answered before it saw the first reply, and the
two processes never worked at the same time (measured: ~1.6x the throughput with 4 KiB
slices; 8 KiB and more lose most of it, 2 KiB gains nothing more)."""


class Inputs:
    """The reader and timer tasks of one connection."""

    def __init__(
        self, conn: LiveConnection, engine: Connection, stream: trio.abc.Stream, writes: Writes
    ) -> None:
        self._conn = conn
        self._engine = engine
        self._stream = stream
        self._writes = writes
        self._held: trio.Event | None = None  # set by the release ``hold`` returned
        self._timer_kick = trio.Event()

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._read_loop)
        nursery.start_soon(self._timer_loop)

    def hold(self) -> Callable[[], None]:
        """Read none of the peer's later frames until the returned ``release`` is called."""
        gate = self._held = trio.Event()
        return gate.set

    def wake_timer(self) -> None:
        """The engine's next deadline may have changed (the peer's idle-time-out is known)."""
        self._timer_kick.set()

    def stop(self) -> None:
        """The connection is over: a held input is let go (the reader goes on to the peer's
        EOF, feeding what the engine ignores) and the timer ends."""
        if self._held is not None:
            self._held.set()
        self._timer_kick.set()

    # -- the reader ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read until the peer's EOF, even after the engine is done: draining what the peer
        still sends lets our close end in a FIN, not a reset that could destroy our last
        frames (a SASL outcome, a close) before the peer reads them."""
        conn, engine, writes, sock = self._conn, self._engine, self._writes, self._writes.socket
        try:
            while True:
                try:
                    if sock is None:
                        data = await self._stream.receive_some(READ_SIZE)
                    else:  # plain TCP: wait, then read (pairlink._io.plain_socket)
                        data = await receive(sock, READ_SIZE)
                except NETWORK_ERRORS as exc:
                    conn.dispatch(engine.connection_lost(), lost=f"read failed: {exc!r}")
                    return
                if not data:
                    conn.dispatch(engine.receive_data(b""), lost="the peer closed the socket")
                    return
                if conn.state is ABANDONED:
                    continue  # read on to the peer's EOF, feeding nothing
                if len(data) > FEED_SLICE:
                    await self._feed_sliced(data)
                elif self._feed(data):
                    await self._resume_held()
                if writes.waiting_bytes() > writes.max_bytes:
                    await writes.wait_drained()
        finally:
            writes.peer_eof.set()

    async def _feed_sliced(self, data: bytes | bytearray) -> None:
        """Feed a read larger than ``FEED_SLICE`` in pieces of that size, what each piece's
        calls produced going out before the next is decoded: written after the piece, or, what
        the socket did not take, by the writer, which gets its turn first (a large message's
        bytes alone yield nothing to send, so they cost no extra task switch)."""
        conn, writes = self._conn, self._writes
        view = memoryview(data)
        for start in range(0, len(view), FEED_SLICE):
            if start and (self._engine.has_output or writes.unsent):
                if writes.waiting_bytes() > writes.max_bytes:
                    await writes.wait_drained()
                else:
                    await trio.lowlevel.checkpoint()
            if conn.state is ABANDONED:
                return
            if self._feed(view[start : start + FEED_SLICE]):
                await self._resume_held()

    def _feed(self, data: bytes | bytearray | memoryview | None) -> bool:
        """Hand bytes to the engine (None: resume the input it holds) and dispatch what they
        meant; True when an ``on_attach`` held the input (``hold``), with bytes still waiting
        in the engine. What the input gave any connection to send, this one's answer included,
        is written through once it is dispatched (``AfterInput``)."""
        conn, engine, out = self._conn, self._engine, self._writes
        held = False
        now = trio.current_time()  # dates the input (the idle timeout counts from it), the answer
        after = out.after
        outer, after.kicked = after.kicked, []
        try:
            events = engine.resume_input() if data is None else engine.receive_data(data, now)
            while True:
                conn.dispatch(events)
                if not engine.input_paused or conn.state is ABANDONED:
                    break
                if self._held is not None:
                    held = True
                    break
                events = engine.resume_input()
        except Exception as exc:  # the engine's own bug: this connection alone pays for it
            conn.abandon(exc)
        finally:
            if engine.has_output or engine.transport_done:  # the engine's own answers too
                out.kick()
            kicked, after.kicked = after.kicked, outer
        for noted in kicked:
            noted.kicked = False
            if not noted.write_through(now):
                noted.kick()
        return held

    async def _resume_held(self) -> None:
        while self._held is not None:
            await self._held.wait()
            self._held = None
            if self._feed(None):
                continue
            return

    # -- the timer -------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Heartbeats and the idle timeout, at the engine's deadlines."""
        conn, engine = self._conn, self._engine
        while conn.state < CLOSED:
            try:
                events = engine.tick(trio.current_time())
            except Exception as exc:
                conn.abandon(exc)
                return
            conn.dispatch(events)
            self._writes.kick()
            deadline = engine.next_deadline
            self._timer_kick = trio.Event()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._timer_kick.wait()
