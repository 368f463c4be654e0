"""The attackers' wire: a hand-written AMQP peer (:class:`Wire`) and the requests it sends."""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from benchmarks.attacks.phases import STEP_TIMEOUT, PhaseTimeout, phase
from pairlink._amqp.framing import (
    AMQP_HEADER,
    FRAME_SASL,
    HEARTBEAT,
    SASL_HEADER,
    Frame,
    FrameReader,
    encode_frame,
)
from pairlink._amqp.messaging import Message, Properties, Source, Target
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslOutcome,
    Transfer,
)
from pairlink._amqp.sasl import SaslClient
from pairlink._io.net import AmqpUrl
from pairlink._rpc import wire as rpc_wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, paired_properties
from pairlink._rpc.payload import Encoding

MIB = 1 << 20
CHUNK = MIB
"""Largest transfer frame payload the attackers send (the server's max-frame-size permitting)."""
FRAME_SLACK = 64
"""Bytes of a transfer frame left for its header and performative."""
BOMB_SIZE = 8 * MIB
"""Bytes of the decode bomb's array elements."""
BOMB_DESCRIPTOR = 0x99
"""A ulong descriptor no AMQP type uses: each element decodes into a ``Described`` around a
ushort, two objects for two bytes on the wire."""
OUR_HANDLE_MAX = 65535
"""The handle-max of our sessions: the server's own decides how many links one holds."""
WINDOW = 2**31 - 1
"""Our sessions' incoming and outgoing windows: the attackers never hold the server back."""
KEEP_REPLIES = 20
"""Replies kept decoded per link (the rest are counted only)."""


@attrs.define(eq=False)
class LinkSeen:
    """What the server said about its end of one of our links."""

    name: str
    server_role: bool
    max_credit: int = 0
    detach: Detach | None = None
    replies: int = 0
    first_replies: list[Message] = attrs.field(factory=list)
    _partial: bytearray = attrs.field(factory=bytearray)

    def take(self, transfer: Transfer, payload: memoryview) -> None:
        self._partial += payload
        if transfer.more:
            return
        self.replies += 1
        if len(self.first_replies) < KEEP_REPLIES:
            self.first_replies.append(Message.decode(bytes(self._partial)))
        self._partial.clear()


@attrs.define(eq=False)
class SessionOut:
    """Our side of one session's numbering."""

    next_delivery: int = 0
    transfers: int = 0  # frames written: our next-outgoing-id
    incoming: int | None = None  # the server's next transfer-id, once its begin has come


class Wire:
    """A hand-driven AMQP peer on one TCP connection (SASL ANONYMOUS). Frames are encoded one
    by one and written when the attack says, past windows, past credit, or without ever ending
    a message: the engine keeps the rules, so it cannot be this peer. The server's frames are
    parsed off the socket as they come. ``sasl``: another mechanism than ANONYMOUS."""

    def __init__(self, stream: trio.SocketStream, sasl: SaslClient | None = None) -> None:
        self.stream = stream
        self.sent = 0  # bytes the socket took
        self.server_open: Open | None = None
        self.begins: dict[int, Begin] = {}  # by our channel
        self.links: dict[tuple[int, str, bool], LinkSeen] = {}  # (channel, name, server role)
        self.dispositions: list[Disposition] = []
        self.ends: list[End] = []
        self.ended_sessions: dict[int, End] = {}  # by our channel: the sessions the server ended
        self.close: Close | None = None
        self.sasl: SaslOutcome | None = None
        self.eof = False
        self._out = bytearray(SASL_HEADER)
        self._tap = FrameReader()
        self._header_due = True  # a protocol header comes first, and again after SASL
        self._channels: dict[int, int] = {}  # the server's channel -> ours
        self._handles: dict[tuple[int, int], LinkSeen] = {}  # (our channel, server handle)
        self._sessions: dict[int, SessionOut] = {}
        self._news = trio.Event()
        sasl = sasl or SaslClient.anonymous()
        encode_frame(self._out, 0, sasl.start([sasl.mechanism]), frame_type=FRAME_SASL)

    def open(self) -> None:
        """The AMQP header and our open: after the SASL outcome."""
        self._out += AMQP_HEADER
        self.write(0, Open(container_id="attacker", desired_capabilities=[LINK_PAIR_V1_0]))

    # -- writing ---------------------------------------------------------------------------

    def write(self, channel: int, performative: Any, payload: bytes | memoryview = b"") -> None:
        encode_frame(self._out, channel, performative, payload)

    async def flush(self) -> None:
        if self._out:
            data = bytes(self._out)
            self._out.clear()
            await self.stream.send_all(data)
            self.sent += len(data)

    def heartbeat(self) -> None:
        """An empty frame: all that keeps an idle connection alive past the idle timeout."""
        self._out += HEARTBEAT

    def begin(self, channel: int) -> None:
        self._sessions[channel] = SessionOut()
        self.write(
            channel,
            Begin(
                next_outgoing_id=0,
                incoming_window=WINDOW,
                outgoing_window=WINDOW,
                handle_max=OUR_HANDLE_MAX,
            ),
        )

    def pair(self, channel: int, name: str, address: str | None, handle: int, credit: int) -> None:
        """Both halves of a pair to ``address`` (None: a gateway's routing node; handles
        ``handle`` and ``handle + 1``) and ``credit`` for replies, in LP-10 order."""
        for offset, role in enumerate((ROLE_SENDER, ROLE_RECEIVER)):
            here, there = Source(address="attacker"), Target(address=address)
            if role is ROLE_RECEIVER:
                here, there = Source(address=address), Target(address="attacker")
            self.write(
                channel,
                Attach(
                    name=name,
                    handle=handle + offset,
                    role=role,
                    source=here,
                    target=there,
                    initial_delivery_count=0 if role is ROLE_SENDER else None,
                    properties=paired_properties(),
                ),
            )
        session = self._sessions[channel]
        self.write(
            channel,
            Flow(
                next_incoming_id=session.incoming,
                incoming_window=WINDOW,
                next_outgoing_id=session.transfers,
                outgoing_window=WINDOW,
                handle=handle + 1,
                link_credit=credit,
            ),
        )

    def transfer(
        self,
        channel: int,
        handle: int,
        chunk: bytes | memoryview,
        *,
        first: bool = True,
        more: bool = False,
        settled: bool = True,
    ) -> None:
        session = self._sessions[channel]
        transfer = Transfer(handle=handle, more=more)
        if first:
            transfer.delivery_id = session.next_delivery
            transfer.delivery_tag = session.next_delivery.to_bytes(4, "big")
            transfer.message_format = 0
            transfer.settled = settled
            session.next_delivery += 1
        session.transfers += 1
        self.write(channel, transfer, chunk)

    def message(self, channel: int, handle: int, payload: bytes, *, settled: bool = True) -> None:
        """One whole message, in as many frames as the server's max-frame-size needs."""
        view, room = memoryview(payload), self.room
        for offset in range(0, max(len(view), 1), room):
            chunk, more = view[offset : offset + room], offset + room < len(view)
            self.transfer(channel, handle, chunk, first=offset == 0, more=more, settled=settled)

    @property
    def room(self) -> int:
        """Payload bytes one transfer frame may carry to this server."""
        limit = self.server_open.max_frame_size if self.server_open is not None else 512
        return min(limit, CHUNK) - FRAME_SLACK

    async def handshake_step(self, what: str, done: Callable[[], bool]) -> None:
        with phase(f"sending for the server's {what}", STEP_TIMEOUT):
            await self.flush()
        if not await self.read_until(done, STEP_TIMEOUT):
            raise PhaseTimeout(f"no {what} from the server (it hung up: {self.ended})")

    # -- reading ---------------------------------------------------------------------------

    def seen(self, channel: int, name: str, server_role: bool) -> LinkSeen | None:
        return self.links.get((channel, name, server_role))

    @property
    def ended(self) -> bool:
        return self.eof or self.close is not None

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """Read and parse the server's frames in the background for the block."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read)
            yield
            nursery.cancel_scope.cancel()

    async def wait_until(self, done: Callable[[], bool], seconds: float) -> bool:
        """Wait (while ``reading``) until ``done()``; False if ``seconds`` passed first or the
        server hung up without it."""
        with trio.move_on_after(seconds):
            while not done() and not self.eof:
                await self._news.wait()
        return done()

    async def read_until(self, done: Callable[[], bool], seconds: float) -> bool:
        async with self.reading():
            return await self.wait_until(done, seconds)

    async def _read(self) -> None:
        while not self.eof:
            try:
                data = await self.stream.receive_some(1 << 16)
            except trio.BrokenResourceError:  # reset by the server
                data = b""
            if not data:
                self.eof = True
            else:
                self._parse(data)
            self._news.set()
            self._news = trio.Event()

    def _parse(self, data: bytes | bytearray) -> None:
        tap = self._tap
        tap.feed(data)
        while True:
            if self._header_due:
                if tap.read_protocol_header() is None:
                    return
                self._header_due = False
            frame = tap.read_frame()
            if frame is None:
                return
            self._take(frame)

    def _take(self, frame: Frame) -> None:
        channel = self._channels.get(frame.channel, frame.channel)
        match frame.performative:
            case SaslOutcome() as perf:
                self.sasl = perf
                self._header_due = True
            case Open() as perf:
                self.server_open = perf
            case Begin() as perf:
                ours = perf.remote_channel if perf.remote_channel is not None else frame.channel
                self._channels[frame.channel] = ours
                self.begins[ours] = perf
                if ours in self._sessions:
                    self._sessions[ours].incoming = perf.next_outgoing_id
            case Attach() as perf:
                link = LinkSeen(perf.name, perf.role)
                self.links[channel, perf.name, perf.role] = link
                self._handles[channel, perf.handle] = link
            case Flow() as perf if perf.handle is not None:
                flowing = self._handles.get((channel, perf.handle))
                if flowing is not None:
                    flowing.max_credit = max(flowing.max_credit, perf.link_credit or 0)
            case Transfer() as perf:
                session = self._sessions.get(channel)
                if session is not None and session.incoming is not None:
                    session.incoming += 1
                carrying = self._handles.get((channel, perf.handle))
                if carrying is not None:
                    carrying.take(perf, frame.payload)
            case Disposition() as perf:
                self.dispositions.append(perf)
            case Detach() as perf:
                detached = self._handles.pop((channel, perf.handle), None)
                if detached is not None:
                    detached.detach = perf
            case End() as perf:
                self.ends.append(perf)
                self.ended_sessions[channel] = perf
            case Close() as perf:
                self.close = perf


@asynccontextmanager
async def wire_to(
    url: str, sasl: SaslClient | None = None, kind: type[Wire] = Wire
) -> AsyncIterator[Wire]:
    """A :class:`Wire` (or a ``kind`` of it) connected to ``url`` (as ``sasl``'s user, else
    anonymous), the server's open read."""
    parsed = AmqpUrl.parse(url)
    with phase("connect", STEP_TIMEOUT):
        stream = await trio.open_tcp_stream(parsed.host, parsed.port)
    async with stream:
        wire = kind(stream, sasl)
        await wire.handshake_step("SASL outcome", lambda: wire.sasl is not None)
        wire.open()
        await wire.handshake_step("open", lambda: wire.server_open is not None)
        yield wire


def request(operation: str, arg: Any, message_id: int) -> bytes:
    """A pairlink request (msgpack envelope, ``reply-to = $me``) with one argument."""
    return rpc_wire.encode_request(operation, (arg,), {}, message_id=message_id, now=time.time())


def bomb_request(message_id: int) -> bytes:
    """A request to echo whose ``amqp-value`` body is an array32 of 2-byte elements, each a
    ushort described by ``BOMB_DESCRIPTOR`` (element constructor ``00 53 99 60``): a tiny
    encoding that decodes into two objects per element."""
    count = BOMB_SIZE // 2
    element = bytes((0x00, 0x53, BOMB_DESCRIPTOR, 0x60))
    array = b"\xf0" + struct.pack(">II", 4 + len(element) + 2 * count, count) + element
    raw = rpc_wire.request_message(
        "echo", (), {}, message_id=message_id, now=time.time(), encoding=Encoding.AMQP_VALUE
    ).encode()
    no_arguments = b"\x00\x53\x77\x45"  # the amqp-value section of an empty list, last
    if not raw.endswith(no_arguments):
        raise RuntimeError(f"unexpected request encoding: ...{raw[-8:].hex()}")
    return raw[:-1] + array + bytes(2 * count)


def endless_head() -> bytes:
    """The start of a request to echo whose data section says 2 GiB follow: the message the
    partial attacker never finishes."""
    raw = Message(
        properties=Properties(message_id=1, reply_to=rpc_wire.ME),
        application_properties={rpc_wire.OPERATION: "echo"},
        body=b"",
        body_kind="data",
    ).encode()
    empty = b"\xa0\x00"  # vbin8 of no bytes, the data section's value, last
    if not raw.endswith(empty):
        raise RuntimeError(f"unexpected message encoding: ...{raw[-8:].hex()}")
    return raw[: -len(empty)] + b"\xb0" + struct.pack(">I", 2**31 - 1)
