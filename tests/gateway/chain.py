"""The three-organisation chain of issue 4 on 127.0.0.1, with byte taps between the hops.

::

    client --tap--> GN --tap--> GO --tap--> CO
    (org N)   org N gateway   org O gateway   org O container (echo at an internal address)

Everything but CO runs in the test's own Trio loop (CO too, unless a test runs it as a
process to kill it). A :class:`ByteTap` is a TCP relay written here: it records every byte in
both directions of every connection through it, and can cut or freeze them; tests decode what
it recorded with the engine's own frame reader (:func:`decode_stream`) and assert on frames and
bytes, never on logs.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from pairlink import handler, hosted, open_server, service
from pairlink._amqp.framing import FrameReader
from pairlink._amqp.messaging import Message, bare_message_span
from pairlink._amqp.performatives import Attach, Detach, Transfer
from pairlink._amqp.session import Session
from pairlink._gateway.config import MAX_PAIRS
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import Receiver, Sender, open_receiver, open_sender
from pairlink._rpc import wire
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.linkpair import paired_properties
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from services.echo import Echo

LOOPBACK = "127.0.0.1"

PUBLIC = "billing"
"""The address org O publishes on GO, and org N on GN (S' of the spec's scenario)."""
INTERNAL = "billing.internal.7f3a"
"""The echo service's address inside org O, on CO (S): never leaves org O."""
GHOST = "ghost"
GHOST_INTERNAL = "ghost.internal.0b1d"
"""GO routes ``ghost`` here, where CO serves nothing: an upstream refusal."""
SLOW = "slow"
SLOW_INTERNAL = "slow.internal.c4e2"
"""A service that holds its calls until the test lets them go (credit end to end)."""

CLIENT_ID = "client-secret-xyz"
"""The container id the tests give their client: its link names and terminus addresses
(``pair-<container id>-<n>``) contain it, so finding it in a byte stream is a leak."""
APPS_USER, APPS_PASSWORD = "org-n-apps", "apps-secret-1"
GUEST_USER, GUEST_PASSWORD = "org-n-guest", "guest-secret-2"
"""A user GN knows but whose routes do not allow."""
UPSTREAM_USER, UPSTREAM_PASSWORD = "org-n", "org-n-secret-3"
"""GN's credentials at GO."""

SLOW_MAILBOX = 2


@service(SLOW_INTERNAL, max_concurrency=1, mailbox=SLOW_MAILBOX)
class Slow:
    """``hold(x)`` answers ``x`` once the test sets :attr:`gate`; at most ``SLOW_MAILBOX``
    calls are held, so callers get that much credit at most."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.started = 0

    @handler
    async def hold(self, x: Any) -> Any:
        self.started += 1
        await self.gate.wait()
        return x


# -- the byte tap ---------------------------------------------------------------------------


@attrs.define(eq=False)
class TapConnection:
    """One TCP connection through a tap: ``up`` is what the connecting side sent (client ->
    server), ``down`` what came back. Bytes are recorded as they arrive, before forwarding."""

    up: bytearray = attrs.field(factory=bytearray)
    down: bytearray = attrs.field(factory=bytearray)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    ended: trio.Event = attrs.field(factory=trio.Event)
    thawed: trio.Event | None = None  # while not None, nothing is forwarded

    def cut(self) -> None:
        """Drop both sockets at once, as a broken network would."""
        self.scope.cancel()

    def freeze(self) -> None:
        if self.thawed is None:
            self.thawed = trio.Event()

    def thaw(self) -> None:
        if self.thawed is not None:
            self.thawed.set()
            self.thawed = None


class ByteTap:
    """A TCP relay on 127.0.0.1 (a free port) to ``127.0.0.1:target_port``, recording every
    byte of every connection. ``target_port`` may change between connections."""

    def __init__(self, name: str, target_port: int) -> None:
        self.name = name
        self.target_port = target_port
        self.port = 0
        self.connections: list[TapConnection] = []

    @property
    def url(self) -> str:
        return f"amqp://{LOOPBACK}:{self.port}"

    def url_as(self, user: str, password: str) -> str:
        return f"amqp://{user}:{password}@{LOOPBACK}:{self.port}"

    def __repr__(self) -> str:
        return f"<ByteTap {self.name} :{self.port} -> :{self.target_port}>"

    # -- what it saw -----------------------------------------------------------------------

    def up_bytes(self) -> bytes:
        return b"".join(bytes(c.up) for c in self.connections)

    def down_bytes(self) -> bytes:
        return b"".join(bytes(c.down) for c in self.connections)

    def all_bytes(self) -> bytes:
        return self.up_bytes() + self.down_bytes()

    def up(self) -> Decoded:
        """The frames the connecting side sent, over every connection, in order."""
        return Decoded.merge(decode_stream(bytes(c.up)) for c in self.connections)

    def down(self) -> Decoded:
        return Decoded.merge(decode_stream(bytes(c.down)) for c in self.connections)

    # -- control ---------------------------------------------------------------------------

    def cut(self) -> None:
        for conn in self.connections:
            conn.cut()

    def freeze(self) -> None:
        """Stop forwarding on the connections open now (new ones flow)."""
        for conn in self.connections:
            conn.freeze()

    def thaw(self) -> None:
        for conn in self.connections:
            conn.thaw()

    # -- running ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[ByteTap] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._relay, listeners)
            task_status.started(self)

    async def _relay(self, downstream: trio.SocketStream) -> None:
        conn = TapConnection()
        self.connections.append(conn)
        try:
            with conn.scope:
                try:
                    upstream = await trio.open_tcp_stream(LOOPBACK, self.target_port)
                except OSError:
                    return  # nobody there: the connecting side sees its socket close
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, conn, downstream, upstream, conn.up)
                        nursery.start_soon(self._pump, conn, upstream, downstream, conn.down)
                finally:
                    await trio.aclose_forcefully(upstream)
        finally:
            conn.ended.set()
            await trio.aclose_forcefully(downstream)

    @staticmethod
    async def _pump(
        conn: TapConnection, src: trio.SocketStream, dst: trio.SocketStream, record: bytearray
    ) -> None:
        try:
            while True:
                data = await src.receive_some(1 << 16)
                if not data:
                    break
                record += data
                while conn.thawed is not None:
                    await conn.thawed.wait()
                await dst.send_all(data)
            await dst.send_eof()  # half-close: the other direction may still have words
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            conn.cut()  # one side is gone: so is the connection


# -- decoding what a tap saw ----------------------------------------------------------------


@attrs.frozen
class TapMessage:
    """A whole message (its transfers' payloads joined) as it crossed a tap."""

    link: str
    """The name of the link it travelled on (from the sender's attach on that handle)."""
    payload: bytes
    settled: bool

    @property
    def message(self) -> Message:
        return Message.decode(self.payload)

    @property
    def bare(self) -> bytes:
        """The bare message: properties through body (Part 3), the bytes a gateway keeps."""
        start, end = bare_message_span(self.payload)
        return self.payload[start:end]

    @property
    def message_id(self) -> Any:
        props = self.message.properties
        return None if props is None else props.message_id

    @property
    def correlation_id(self) -> Any:
        props = self.message.properties
        return None if props is None else props.correlation_id


@attrs.define
class Decoded:
    """What one side sent through a tap: its AMQP performatives and whole messages."""

    frames: list[Any] = attrs.field(factory=list)
    messages: list[TapMessage] = attrs.field(factory=list)

    @classmethod
    def merge(cls, parts: Iterable[Decoded]) -> Decoded:
        out = cls()
        for part in parts:
            out.frames += part.frames
            out.messages += part.messages
        return out

    def of(self, kind: type, **fields: Any) -> list[Any]:
        return [
            f
            for f in self.frames
            if isinstance(f, kind) and all(getattr(f, k) == v for k, v in fields.items())
        ]

    def attaches(self) -> list[Attach]:
        return self.of(Attach)

    def by_message_id(self) -> dict[Any, TapMessage]:
        return {m.message_id: m for m in self.messages}

    def by_correlation_id(self) -> dict[Any, TapMessage]:
        return {m.correlation_id: m for m in self.messages}


def decode_stream(data: bytes) -> Decoded:
    """Every frame in one direction of one connection: protocol headers (SASL, then AMQP)
    are stepped over wherever they come, SASL frames skipped, AMQP performatives kept, and
    transfers joined into messages. A frame cut short by the end of the bytes is ignored."""
    out = Decoded()
    reader = FrameReader()
    links: dict[tuple[int, int], str] = {}
    partial: dict[tuple[int, int], bytearray] = {}
    pos, end = 0, len(data)
    while pos + 8 <= end:
        if data[pos : pos + 4] == b"AMQP":  # a protocol header: no frame's size reads so
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        if pos + size > end:
            break
        reader.feed(data[pos : pos + size])
        pos += size
        frame = reader.read_frame()
        assert frame is not None
        perf = frame.performative
        if perf is None or frame.type != 0:  # a heartbeat, or SASL
            continue
        out.frames.append(perf)
        key = (frame.channel, getattr(perf, "handle", -1))
        if isinstance(perf, Attach):
            links[key] = perf.name
        elif isinstance(perf, Detach):
            links.pop(key, None)
        elif isinstance(perf, Transfer):
            buf = partial.setdefault(key, bytearray())
            buf += frame.payload
            if perf.more:
                continue
            del partial[key]
            if not perf.aborted:
                out.messages.append(TapMessage(links.get(key, "?"), bytes(buf), bool(perf.settled)))
    return out


# -- the chain --------------------------------------------------------------------------------


class GatewayTask:
    """One gateway in the test's nursery, which a test may stop and start again on its port."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.gateway: Gateway | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()

    @property
    def port(self) -> int:
        assert self.gateway is not None
        return self.gateway.port

    async def start(self, nursery: trio.Nursery) -> Gateway:
        self._stopped = trio.Event()
        gateway: Gateway = await nursery.start(self._run)
        self.gateway = gateway
        # the same port again on a restart
        self.config = attrs.evolve(self.config, listen=f"amqp://{LOOPBACK}:{gateway.port}")
        return gateway

    async def _run(self, *, task_status: trio.TaskStatus[Gateway]) -> None:
        try:
            with trio.CancelScope() as self._scope:
                async with open_gateway(self.config) as gateway:
                    task_status.started(gateway)
                    await trio.sleep_forever()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()


@attrs.define(eq=False)
class Chain:
    """client -> ``client_gn`` -> GN -> ``gn_go`` -> GO -> ``go_co`` -> CO."""

    nursery: trio.Nursery
    gn: GatewayTask
    go: GatewayTask
    client_gn: ByteTap
    gn_go: ByteTap
    go_co: ByteTap
    slow: Slow

    @property
    def url(self) -> str:
        """Where org N's applications connect (through the first tap), as ``org-n-apps``."""
        return self.client_gn.url_as(APPS_USER, APPS_PASSWORD)

    def url_as(self, user: str, password: str) -> str:
        return self.client_gn.url_as(user, password)

    @property
    def taps(self) -> tuple[ByteTap, ByteTap, ByteTap]:
        return self.client_gn, self.gn_go, self.go_co

    async def restart_go(self) -> None:
        """Stop GO (its connections close) and start a new one on the same port."""
        await self.go.stop()
        await self.go.start(self.nursery)


def free_port() -> int:
    """A port nobody listens on now (for a process that must come back on the same one)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def gn_config(
    upstream: str, *, idle_timeout: float, max_pairs: int = MAX_PAIRS, shares: bool = False
) -> GatewayConfig:
    def route(public: str) -> Route:
        return Route(
            public=public,
            upstream=upstream,
            address=public,
            user=UPSTREAM_USER,
            password=UPSTREAM_PASSWORD,
            allow=frozenset({APPS_USER}),
        )

    return GatewayConfig(
        listen=f"amqp://{LOOPBACK}:0",
        routes=(route(PUBLIC), route(GHOST), route(SLOW)),
        users={APPS_USER: APPS_PASSWORD, GUEST_USER: GUEST_PASSWORD},
        container_id="gn",
        idle_timeout=idle_timeout,
        attach_timeout=5.0,
        max_pairs=max_pairs,
        # unless ``shares``, one client's connection may fill the gateway: most tests here
        # are about the total (the shares' defaults are tested in test_capacity.py)
        max_pairs_per_user=None if shares else max_pairs,
        max_pairs_per_connection=None if shares else max_pairs,
    )


def go_config(upstream: str, *, idle_timeout: float) -> GatewayConfig:
    def route(public: str, address: str) -> Route:
        return Route(
            public=public, upstream=upstream, address=address, allow=frozenset({UPSTREAM_USER})
        )

    return GatewayConfig(
        listen=f"amqp://{LOOPBACK}:0",
        routes=(route(PUBLIC, INTERNAL), route(GHOST, GHOST_INTERNAL), route(SLOW, SLOW_INTERNAL)),
        users={UPSTREAM_USER: UPSTREAM_PASSWORD},
        container_id="go",
        idle_timeout=idle_timeout,
        attach_timeout=5.0,
    )


@asynccontextmanager
async def open_chain(
    *,
    co_port: int | None = None,
    idle_timeout: float = 5.0,
    gn_max_pairs: int = MAX_PAIRS,
    gn_pair_shares: bool = False,
    echo_mailbox: int | None = None,
) -> AsyncIterator[Chain]:
    """The whole chain, torn down when the block ends. CO (echo at ``INTERNAL``, :class:`Slow`
    at ``SLOW_INTERNAL``) runs here unless ``co_port`` says where a CO of the test's own
    listens (or will); ``echo_mailbox`` sizes its echo's mailbox (None: the default)."""
    async with trio.open_nursery() as nursery:
        slow = Slow()
        if co_port is None:
            co = await _start_co(nursery, slow, echo_mailbox)
            co_port = co
        go_co: ByteTap = await nursery.start(ByteTap("go-co", co_port).run)
        go = GatewayTask(go_config(go_co.url, idle_timeout=idle_timeout))
        await go.start(nursery)
        gn_go: ByteTap = await nursery.start(ByteTap("gn-go", go.port).run)
        gn = GatewayTask(
            gn_config(
                gn_go.url,
                idle_timeout=idle_timeout,
                max_pairs=gn_max_pairs,
                shares=gn_pair_shares,
            )
        )
        await gn.start(nursery)
        client_gn: ByteTap = await nursery.start(ByteTap("client-gn", gn.port).run)
        try:
            yield Chain(nursery, gn, go, client_gn, gn_go, go_co, slow)
        finally:
            slow.gate.set()  # a held call must not hold up the shutdown
            with trio.move_on_after(10, shield=True):
                await gn.stop()
                await go.stop()
            nursery.cancel_scope.cancel()


async def _start_co(nursery: trio.Nursery, slow: Slow, echo_mailbox: int | None) -> int:
    async def serve(*, task_status: trio.TaskStatus[int]) -> None:
        async with open_server(
            hosted(Echo, address=INTERNAL, mailbox=echo_mailbox),
            slow,
            listen=f"amqp://{LOOPBACK}:0",
            container_id="co",
            grace=1,
        ) as server:
            task_status.started(server.port)
            await trio.sleep_forever()

    port: int = await nursery.start(serve)
    return port


# -- small helpers for the tests ------------------------------------------------------------


def attach_pair(
    conn: AmqpConnection,
    name: str,
    *,
    address: str | None = PUBLIC,
    session: Session | None = None,
    credit: int = 1,
) -> tuple[Sender, Receiver]:
    """Attach a pair by hand (LP-3: one name, own addresses mirrored), pipelined, no wait;
    its receiver grants ``credit`` for replies."""
    sender = open_sender(
        conn,
        address,
        name=name,
        source_address=name,
        properties=paired_properties(),
        session=session,
    )
    receiver = open_receiver(
        conn,
        address,
        name=name,
        target_address=name,
        properties=paired_properties(),
        session=session,
        credit=credit,
    )
    return sender, receiver


async def echo_on(sender: Sender, receiver: Receiver, value: Any, deadline: float = 30) -> Any:
    """One echo call on a hand-made pair, its request expiring ``deadline`` seconds from
    now: its reply's value."""
    request = wire.request_message(
        "echo", [value], {}, message_id=f"echo-{value}", now=wall_time(), timeout=deadline
    )
    await sender.send(request, settled=True)
    return wire.parse_reply((await receiver.receive()).message)


async def wait_until(condition: Any, within: float = 5.0, step: float = 0.005) -> None:
    """Poll ``condition()`` until it holds (``TooSlowError`` after ``within`` seconds): for
    state in other tasks or processes that offers no event to wait on (what a tap saw)."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - no event exists for "the tap saw it"
            await trio.sleep(step)


def requests_on(decoded: Decoded, operation: str) -> list[TapMessage]:
    """The messages of ``decoded`` that are requests for ``operation``."""
    out = []
    for m in decoded.messages:
        app = m.message.application_properties or {}
        if app.get("operation") == operation:
            out.append(m)
    return out


def names_in(frames: Sequence[Any]) -> set[str]:
    return {f.name for f in frames if isinstance(f, Attach)}


def routed_request(i: int, to: str | None, operation: str = "echo") -> Message:
    """A request for the routing node (LP-9), to ``to``."""
    message = wire.request_message(
        operation, [f"routed-{i}"], {}, message_id=f"routed-{i}", now=wall_time(), timeout=10
    )
    assert message.properties is not None
    message.properties.to = to
    return message
