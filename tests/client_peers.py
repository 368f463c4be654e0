"""A responder for the client tests: a bare sans-IO engine behind a Trio TCP listener.

The test decides every answer (how attaches are answered, when and how requests are replied
to, when the connection dies) and sees every frame the client sent, in order, with the number
of the socket read that brought it. Clients connect with ``sasl=False`` so the byte stream is
the AMQP header followed by frames, which the frame tap reads beside the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from proton import Message as ProtonMessage

from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import Event, LinkAttachRequested, MessageReceived
from pairlink._amqp.framing import FrameReader
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Accepted, Message
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Close, Transfer
from pairlink._rpc import deadline, wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0


@attrs.define(eq=False)
class Incoming:
    """A request the server received, with what it needs to answer it."""

    peer: RawPeer
    link: Link
    delivery: Delivery
    message: Message
    request: wire.Request

    def reply(self, value: Any) -> None:
        self.peer.send_reply(self.link.name, wire.reply_message(self.request, value, to=wire.ME))

    def fail(self, status: int, description: str, error_type: str | None = None) -> None:
        message = wire.error_message(
            self.request, status, description, to=wire.ME, error_type=error_type
        )
        self.peer.send_reply(self.link.name, message)


Answer = Callable[["RawPeer", Link], None]
OnRequest = Callable[[Incoming], None]


def echo_attach(peer: RawPeer, link: Link) -> None:
    """Answer like a pairing responder: mirror the termini and properties, grant credit."""
    peer.engine.answer_attach(
        link,
        source=link.remote_source,
        target=link.remote_target,
        properties=link.remote_properties,
    )
    if link.is_receiver:
        peer.engine.flow(link, peer.server.credit)


def arithmetic(incoming: Incoming) -> None:
    """``add`` sums its arguments, ``echo`` returns its first, anything else is a 404."""
    request = incoming.request
    if request.operation == "add":
        incoming.reply(sum(request.args))
    elif request.operation == "echo":
        incoming.reply(request.args[0])
    else:
        incoming.fail(wire.NOT_FOUND, f"no operation {request.operation!r}")


class RawPeer:
    """One accepted connection: the engine, the frames received, the requests."""

    def __init__(self, server: RawServer, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.engine = Connection(
            ConnectionConfig(
                "raw-server",
                offered_capabilities=[LINK_PAIR_V1_0] if server.offer else (),
            ),
            initiator=False,
        )
        self.frames: list[tuple[int, Any]] = []
        """(number of the socket read that brought it, performative), in arrival order."""
        self.incoming: list[Incoming] = []
        self.scope = trio.CancelScope()
        self._tap = FrameReader()
        self._header_seen = False
        self._held = bytearray()
        self._holding = False
        self._wake = trio.Event()
        self._arrived = trio.Event()

    def performatives(self, *kinds: type) -> list[Any]:
        return [p for _, p in self.frames if isinstance(p, kinds)]

    async def wait_for(self, kind: type, count: int = 1) -> list[Any]:
        """Wait until ``count`` frames of ``kind`` have come from the client."""
        while len(found := self.performatives(kind)) < count:
            await self._arrived.wait()
        return found

    # -- actions (from the test or its callbacks) ------------------------------------------

    def send_reply(self, link_name: str, message: Message) -> None:
        link = self.reply_link(link_name)
        self.engine.send(link, message.encode())
        self.kick()

    def reply_link(self, name: str) -> Link:
        for session in self.engine.sessions.values():
            link = session.names.get((name, ROLE_SENDER))
            if link is not None:
                return link
        raise LookupError(f"no sending link named {name!r}")

    def kick(self) -> None:
        self._wake.set()

    async def abort(self) -> None:
        """Drop the connection without a close frame, as a crashed server would."""
        self.scope.cancel()
        await trio.aclose_forcefully(self.stream)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop)
                await self._read_loop()
                nursery.cancel_scope.cancel()

    async def _read_loop(self) -> None:
        reads = 0
        while True:
            try:
                data = await self.stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            reads += 1
            self._record(data, reads)
            if self.server.deaf_to_close and self.performatives(Close):
                continue
            if self._holding:
                self._held += data
                if not any(isinstance(p, Transfer) for _, p in self.frames):
                    continue
                data, self._holding = bytes(self._held), False
            self._feed(data)

    def _record(self, data: bytes, reads: int) -> None:
        self._tap.feed(data)
        if not self._header_seen:
            if self._tap.read_protocol_header() is None:
                return
            self._header_seen = True
        while (frame := self._tap.read_frame()) is not None:
            if frame.performative is not None:
                self.frames.append((reads, frame.performative))
                self._arrived.set()
                self._arrived = trio.Event()
                if isinstance(frame.performative, Attach) and self.server.hold_links:
                    self._holding = True

    def _feed(self, data: bytes) -> None:
        events = self.engine.receive_data(data)
        while True:
            for event in events:
                self._on_event(event)
            if not self.engine.input_paused:
                break
            events = self.engine.resume_input()
        self.kick()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, LinkAttachRequested):
            self.server.answer(self, event.link)
        elif isinstance(event, MessageReceived):
            message = Message.decode(event.payload)
            request = wire.parse_request(message, now=deadline.wall_time())
            incoming = Incoming(self, event.link, event.delivery, message, request)
            self.incoming.append(incoming)
            if not event.delivery.settled:
                self.engine.settle(event.delivery, self.server.outcome(incoming))
            self.server.on_request(incoming)

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            data = self.engine.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return


class RawServer:
    """Accepts connections on 127.0.0.1 (port 0) and runs a :class:`RawPeer` for each.

    ``offer``: LINK_PAIR_V1_0 in our open; ``answer``: how attaches are answered;
    ``on_request``: what happens to each request (it may reply later, or never);
    ``outcome``: the disposition of an unsettled request; ``hold_links``: read nothing the
    client sends from its first attach on until its first transfer has arrived (a client that
    waits for an answer before sending then never sends: the test sees it hang);
    ``deaf_to_close``: never answer the client's close (nor read past it), keeping the socket.
    """

    def __init__(
        self,
        *,
        offer: bool = True,
        answer: Answer = echo_attach,
        on_request: OnRequest = arithmetic,
        outcome: Callable[[Incoming], Any] = lambda _incoming: Accepted(),
        hold_links: bool = False,
        credit: int = 100,
        deaf_to_close: bool = False,
    ) -> None:
        self.offer = offer
        self.answer = answer
        self.on_request = on_request
        self.outcome = outcome
        self.hold_links = hold_links
        self.credit = credit
        self.deaf_to_close = deaf_to_close
        self.peers: list[RawPeer] = []
        self.port = 0
        self.connected = trio.Event()

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer = RawPeer(self, stream)
        self.peers.append(peer)
        self.connected.set()
        async with stream:
            await peer.run()


@asynccontextmanager
async def raw_server(**options: Any) -> AsyncIterator[RawServer]:
    server = RawServer(**options)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


def proton_arithmetic(request: ProtonMessage) -> ProtonMessage | None:
    """A ``ProtonServer`` responder speaking our wire conventions: it reads the arguments from
    the amqp-value body our client sends a peer that is not pairlink (a list: the positional
    arguments, anything else: the one argument), answers ``add``/``mul``/``echo`` with an
    amqp-value body, ``hang`` never, and anything else with a 404."""
    body = request.body
    properties: dict[str, Any] = dict(request.properties or {})  # Proton types it loosely
    assert not isinstance(body, bytes | memoryview)  # no envelope: this peer does not offer it
    args: list[Any] = body if isinstance(body, list) else [body]
    operation = properties["operation"]
    if operation == "hang":
        return None
    if operation == "add":
        value = sum(args)
    elif operation == "mul":
        value = args[0] * args[1]
    elif operation == "echo":
        value = args[0]
    else:
        return ProtonMessage(
            properties={wire.STATUS_CODE: wire.NOT_FOUND, wire.STATUS_DESCRIPTION: "no such op"}
        )
    return ProtonMessage(body=value, properties={wire.STATUS_CODE: wire.OK})
