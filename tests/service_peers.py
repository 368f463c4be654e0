"""A caller for the service tests: a bare sans-IO engine over a real TCP socket.

The test decides every frame the caller sends (attach fields, credit, settlement, pipelining)
and sees every frame the server sent back, in order: a tap reads the byte stream beside the
engine. This is what lets a test state the LP rules as "these frames, and nothing else".
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import Event, LinkAttached, MessageReceived
from pairlink._amqp.framing import FRAME_AMQP, FRAME_SASL, FrameReader
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Message, Source, Target
from pairlink._amqp.performatives import (
    RCV_FIRST,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_MIXED,
    Attach,
    Detach,
    Disposition,
    Flow,
    SaslOutcome,
    Transfer,
)
from pairlink._amqp.sasl import SaslClient
from pairlink._amqp.session import Session
from pairlink._rpc import deadline, wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, paired_properties
from pairlink._rpc.payload import Encoding

TIMEOUT = 2.0


class RawClient:
    """One connection to a server, driven by the test; ``frames`` holds what the server said."""

    def __init__(
        self, stream: trio.abc.Stream, *, desired: tuple[str, ...], sasl: SaslClient | None = None
    ) -> None:
        self.stream = stream
        self.engine = Connection(
            ConnectionConfig(
                "raw-client",
                hostname="127.0.0.1",
                sasl=SaslClient.anonymous() if sasl is None else sasl,
                desired_capabilities=desired,
            ),
            initiator=True,
        )
        self.frames: list[Any] = []  # the server's AMQP performatives, in order
        self.events: list[Event] = []
        self._tap = FrameReader()
        self._header_due = True  # a protocol header comes first, and again after SASL
        self._ids = itertools.count(1)
        self.engine.open()
        self.session: Session = self.engine.begin()

    # -- I/O -------------------------------------------------------------------------------

    async def flush(self) -> None:
        data = self.engine.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def read_until(self, done: Callable[[], bool], within: float = TIMEOUT) -> None:
        """Send what is queued, then read until ``done()`` (``TooSlowError`` after
        ``within`` seconds: a frame that never comes fails the test, it does not hang it)."""
        await self.flush()
        with trio.fail_after(within):
            while not done():
                data = await self.stream.receive_some(1 << 16)
                if not data:
                    raise EOFError("the server closed the connection")
                self._take(data)
                await self.flush()

    async def read_once(self, within: float = TIMEOUT) -> None:
        """Send what is queued, then take one read's worth of the server's frames."""
        await self.flush()
        with trio.fail_after(within):
            data = await self.stream.receive_some(1 << 16)
        if not data:
            raise EOFError("the server closed the connection")
        self._take(data)

    def _take(self, data: bytes | bytearray) -> None:
        tap = self._tap
        tap.feed(data)
        while True:
            if self._header_due:
                if tap.read_protocol_header() is None:
                    break
                self._header_due = False
                continue
            frame = tap.read_frame()
            if frame is None:
                break
            if frame.type == FRAME_SASL and isinstance(frame.performative, SaslOutcome):
                self._header_due = True
            elif frame.type == FRAME_AMQP and frame.performative is not None:
                self.frames.append(frame.performative)
        events = self.engine.receive_data(data)
        while True:
            self.events.extend(events)
            if not self.engine.input_paused:
                break
            events = self.engine.resume_input()

    async def opened(self) -> None:
        await self.read_until(lambda: self.engine.remote_open is not None)

    # -- links -----------------------------------------------------------------------------

    def attach(
        self,
        name: str,
        role: bool,
        *,
        source: str | None = None,
        target: str | None = None,
        properties: dict[Any, Any] | None = None,
        dynamic: bool = False,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        max_message_size: int | None = None,
    ) -> Link:
        """Queue an attach; a receiving link (``role=ROLE_RECEIVER``) gets no credit yet."""
        return self.engine.attach(
            self.session,
            name=name,
            role=role,
            source=Source(address=source, dynamic=dynamic),
            target=Target(address=target),
            properties=properties,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            max_message_size=max_message_size,
        )

    def pair(
        self, address: str, name: str = "pair", *, reply_credit: int = 100, here: str = "me"
    ) -> tuple[Link, Link]:
        """Both halves of a link pair to ``address`` plus reply credit, queued (LP-10 order)."""
        sender = self.attach(
            name, ROLE_SENDER, source=here, target=address, properties=paired_properties()
        )
        receiver = self.attach(
            name, ROLE_RECEIVER, source=address, target=here, properties=paired_properties()
        )
        self.engine.flow(receiver, reply_credit)
        return sender, receiver

    def request(
        self,
        link: Link,
        operation: str,
        *args: Any,
        reply_to: str | None = wire.ME,
        timeout: float | None = None,
        settled: bool = True,
        encoding: Encoding = Encoding.ENVELOPE,
        message_id: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, Delivery]:
        """Queue a request (sent with credit presumed, as LP-10 allows before the answer);
        returns its message-id and delivery."""
        mid = next(self._ids) if message_id is None else message_id
        message = wire.request_message(
            operation,
            args,
            kwargs,
            message_id=mid,
            now=deadline.wall_time(),
            timeout=timeout,
            reply_to=reply_to,
            encoding=encoding,
        )
        return mid, self.send(link, message, settled=settled)

    def send(self, link: Link, message: Message | bytes, *, settled: bool = True) -> Delivery:
        payload = message.encode() if isinstance(message, Message) else message
        return self.engine.send(link, payload, settled=settled, presume_credit=True)

    # -- what came back --------------------------------------------------------------------

    def of(self, kind: type, **fields: Any) -> list[Any]:
        """The server's frames of ``kind`` whose ``fields`` have these values."""
        return [
            f
            for f in self.frames
            if isinstance(f, kind) and all(getattr(f, k) == v for k, v in fields.items())
        ]

    def link_frames(self, name: str, role: bool) -> list[Any]:
        """Frames the server sent about its end of link ``name``, where the server's role
        is ``role``: its attach, then the flows, transfers and detach with its handle."""
        out: list[Any] = []
        handle = None
        for f in self.frames:
            if isinstance(f, Attach) and f.name == name and f.role is role:
                out.append(f)
                handle = f.handle
            elif isinstance(f, Flow | Transfer | Detach) and handle is not None:
                if f.handle == handle:
                    out.append(f)
                if isinstance(f, Detach) and f.handle == handle:
                    handle = None
        return out

    def replies(self, link: Link | None = None) -> list[Message]:
        return [
            Message.decode(e.payload)
            for e in self.events
            if isinstance(e, MessageReceived) and (link is None or e.link is link)
        ]

    def reply_to(self, message_id: Any) -> Message | None:
        for message in self.replies():
            if message.properties is not None and message.properties.correlation_id == message_id:
                return message
        return None

    async def wait_reply(self, message_id: Any, within: float = TIMEOUT) -> Message:
        await self.read_until(lambda: self.reply_to(message_id) is not None, within)
        reply = self.reply_to(message_id)
        assert reply is not None
        return reply

    async def wait_attached(self, link: Link) -> None:
        await self.read_until(
            lambda: any(isinstance(e, LinkAttached) and e.link is link for e in self.events)
        )

    def dispositions(self) -> list[Disposition]:
        return self.of(Disposition)


def status(reply: Message) -> int:
    app = reply.application_properties or {}
    return int(app[wire.STATUS_CODE])


def app_property(reply: Message, key: str) -> Any:
    return (reply.application_properties or {}).get(key)


async def wait_for(condition: Callable[[], bool], within: float = TIMEOUT) -> None:
    """Wait until ``condition()`` holds for state of the server, which runs in other tasks
    of this process and offers no event to wait on: polling is the honest way to see it."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - no event exists for "the server got there"
            await trio.sleep(0.001)


@asynccontextmanager
async def raw_client(
    url: str, *, desired: tuple[str, ...] = (LINK_PAIR_V1_0,), sasl: SaslClient | None = None
) -> AsyncIterator[RawClient]:
    """A :class:`RawClient` connected to ``url`` (``amqp://host:port``), opened (logged in
    with ``sasl``, else anonymous)."""
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        client = RawClient(stream, desired=desired, sasl=sasl)
        await client.opened()
        yield client
