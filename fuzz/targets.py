"""What one fuzz input does: a hostile peer's bytes, fed to the engine, to a service container
and to a gateway, each run the way a listener runs it.

An input is one mode byte, then the peer's bytes. The mode byte (:class:`Mode`) says how far a
well-behaved peer got before the fuzzed bytes take over (so the fuzzer spends its time on
attach, flow and transfer instead of rediscovering SASL), in what pieces the bytes arrive, how
long the peer then stays silent before it hangs up (virtual time: idle timeouts and heartbeats
cost nothing), and whether our side runs with small limits (``small_limits``: each within
reach of a short input).

A target raises when pairlink fails, and atheris reports that as a crash:

* any exception out of the engine's ``receive_data`` or ``tick``, or out of an engine method
  called the way the container calls it (mirroring the peer's termini, settling with the
  peer's outcome); any exception out of a container, a gateway or their connection other
  than the peer's socket breaking (which a listener absorbs too);
* an error logged while the container or gateway ran (the Trio layer's backstop turns an
  exception in our own handling into a close with ``amqp:internal-error`` and a log line: that
  hides it from the peer, not from us), except a handler's own failure (``call.failed``);
* :class:`Failure`: bytes of ours that our own decoder cannot read (frames, and the messages
  the container and gateway send), a frame after our close (§2.7.9: a close says no more
  frames follow), an error condition ``amqp:internal-error`` in our output, a protocol
  violation not answered with a close, or a run that does not end within
  ``RUN_LIMIT`` virtual seconds (a hang; a hang that blocks the event loop for real is caught
  by libFuzzer's per-input timeout instead).
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import attrs
import structlog
import trio
import trio.testing

from pairlink import open_server
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.errors import INTERNAL_ERROR
from pairlink._amqp.events import (
    DeliveryUpdated,
    Event,
    LinkAttachRequested,
    LinkFlow,
    MessageReceived,
    ProtocolViolation,
)
from pairlink._amqp.framing import AMQP_HEADER, FrameReader
from pairlink._amqp.link import Link, LinkState
from pairlink._amqp.messaging import Accepted, Error, Message, Source, Target
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER, Close, Detach, End, Transfer
from pairlink._amqp.sasl import SaslClient, SaslServer
from pairlink._amqp.session import Session, SessionState
from pairlink._gateway.upstream import UpstreamUnavailable
from pairlink._io.connection import OnAttach
from pairlink._io.net import open_connection
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, paired_properties
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from services.echo import Echo

SERVICE = "echo"
"""The address the scripted peer pairs with: the echo service, and the gateway's route to it."""
PRIVATE_ROUTE = "private"
"""A gateway route the fuzzing user may not use (``amqp:unauthorized-access``)."""
USER, PASSWORD = "fuzz", "fuzz-password"
STRANGER = "stranger"
PEER_ID = "fuzz-peer"
CONTAINER_ID = "fuzz-container"
"""The fuzzed container's name: fixed, so its dynamic node addresses are too."""
LOOPBACK = "amqp://127.0.0.1:0"
CREDIT = 8
"""Credit the engine harness grants each link the peer sends on: little, so that a short input
can run out of it (the container grants its mailbox's share)."""
SEND_BUDGET = 16
"""Messages the engine harness sends on the peer's receiving links, per input: enough for
credit, drain and disposition paths, few enough to keep an input fast."""
CONTAINER_IDLE = 60.0
"""The idle timeout a service listener runs with by default (``pairlink._io.listener.listen``)."""
GATEWAY_IDLE = 30.0
"""The idle timeout of the fuzzed gateway: the default of ``GatewayConfig``."""
GRACE = 10.0
"""The container's shutdown grace period (``open_server``'s default)."""
REAL_LIMIT = 10.0
"""Real seconds one input may take where libFuzzer's per-input timeout (1 s) is not watching,
as in the tests: a task that never sleeps stops the virtual clock, so only real time ends it."""
GATEWAY_AUTOJUMP = 0.002
"""Real seconds every task must have waited before the gateway target's clock jumps. Its
upstream hop is real TCP, whose bytes can still be in the kernel (on a loaded machine) when
every task waits: jumping at once could then time out a pair about to be answered, and an input
would not do the same thing twice. Costs the gateway target about a third of its speed."""
RUN_LIMIT = 1000.0
"""Virtual seconds one input may take, from the server's start to its shutdown: the longest
silence (``WAITS``) plus every timeout on the way (attach, idle, grace) is well below it, so a
run that is not over by then hangs."""
UPSTREAM_RETRY = 0.1
"""Virtual seconds between looks at a gateway upstream that is not up yet."""
MAX_PIECES = 64
"""The container and gateway targets send an input in this many pieces at most, waiting for
our side to go quiet after each: byte-at-a-time delivery is the engine target's to test."""
SPLITS = (0, 1, 7, 512)
"""Piece sizes the mode byte chooses from (0: the whole input at once)."""
WAITS = (0.0, 1.0, 35.0, 120.0)
"""Seconds of silence before the peer hangs up: none, a heartbeat's worth, past the gateway's
idle timeout, past the container's."""
EXPECTED_ERRORS = frozenset({"call.failed"})
"""Error log events that are not pairlink's failure: a handler's own exception (the echo
service's ``sleep`` given a string) is answered 500 and logged, as it should be."""


class Failure(AssertionError):
    """pairlink misbehaved on this input (see the module's docstring)."""


class Stage(enum.IntEnum):
    """How far the well-behaved peer got before the fuzzed bytes take over."""

    RAW = 0  # nothing: the input starts with the protocol header
    SASL = 1  # SASL done and the AMQP header sent: the input starts with the open
    OPEN = 2  # open sent: the input starts with a begin
    PAIR = 3  # a session and a pair of links to SERVICE, with reply credit: transfers next


@attrs.frozen
class Mode:
    """The first byte of an input: bits 0-1 the stage, 2-3 the piece size, 4-5 the silence
    before hanging up, 6 small limits (bit 7 is unused)."""

    stage: Stage = Stage.RAW
    split: int = 0
    wait: float = 0.0
    small: bool = False

    @classmethod
    def of(cls, byte: int) -> Mode:
        return cls(
            Stage(byte & 3), SPLITS[byte >> 2 & 3], WAITS[byte >> 4 & 3], bool(byte >> 6 & 1)
        )

    def byte(self) -> int:
        return (
            self.stage
            | SPLITS.index(self.split) << 2
            | WAITS.index(self.wait) << 4
            | int(self.small) << 6
        )

    def pieces(self, data: bytes, max_pieces: int | None = None) -> Iterator[bytes]:
        size = self.split or len(data) or 1
        if max_pieces is not None:
            size = max(size, -(-len(data) // max_pieces))
        for start in range(0, len(data), size):
            yield data[start : start + size]


def split_input(data: bytes) -> tuple[Mode, bytes]:
    """An input's mode and the peer's bytes (the fuzzed ones, without the stage's prefix)."""
    return (Mode.of(data[0]), data[1:]) if data else (Mode(), b"")


def server_config(
    *, container_id: str, sasl: SaslServer, idle_timeout: float, small: bool
) -> ConnectionConfig:
    """Our side's engine settings, as a listener makes them (small limits on request)."""
    config = ConnectionConfig(
        container_id=container_id,
        idle_timeout=idle_timeout,
        offered_capabilities=[LINK_PAIR_V1_0],
        sasl=sasl,
    )
    return small_limits(config) if small else config


def small_limits(config: ConnectionConfig) -> ConnectionConfig:
    """``config`` with every limit small enough for a short input to cross it: the smallest
    frame AMQP allows, a 4-frame session window, 2 KiB messages and 4 KiB of partial ones, 8
    handles per session, 4 unsettled deliveries per link, 256 values per frame."""
    return attrs.evolve(
        config,
        max_frame_size=512,
        session_window=4,
        max_message_size=2048,
        max_incomplete_bytes=4096,
        handle_max=7,
        max_unsettled=4,
        max_decoded_elements=256,
    )


def engine_config(small: bool) -> ConnectionConfig:
    """The engine target's settings: a listener with a PLAIN user that also takes anonymous
    peers, so both SASL mechanisms are in reach."""
    return server_config(
        container_id="fuzz-engine",
        sasl=SaslServer.with_users({USER: PASSWORD}, allow_anonymous=True),
        idle_timeout=CONTAINER_IDLE,
        small=small,
    )


# -- the engine target ---------------------------------------------------------------------------


class EngineHarness:
    """Our side of a connection on the bare engine, acting as the container acts: every
    attach answered (the peer's termini mirrored) and given credit, every request settled,
    messages sent on the peer's receiving links while they have credit (and its drains
    answered once the budget is spent), and the peer's decisions on our deliveries settled
    with the outcome it chose."""

    def __init__(self, config: ConnectionConfig) -> None:
        self.engine = Connection(config, initiator=False)
        self.events: list[Event] = []
        self.sent = bytearray()
        self._budget = SEND_BUDGET
        self._message = Message(body="fuzz").encode()

    def feed(self, data: bytes) -> None:
        engine = self.engine
        events = engine.receive_data(data)
        while True:
            self.events += events
            for event in events:
                self._act(event)
            if not engine.input_paused:
                break
            events = engine.resume_input()

    def tick(self, now: float) -> None:
        self.events += self.engine.tick(now)

    def drain_output(self) -> bytes:
        data = self.engine.data_to_send()
        self.sent += data
        return data

    def _act(self, event: Event) -> None:
        engine = self.engine
        if engine.closed:
            return
        if isinstance(event, LinkAttachRequested):
            link = event.link
            engine.answer_attach(link, source=link.remote_source, target=link.remote_target)
            if link.is_receiver:
                engine.flow(link, CREDIT)
        elif isinstance(event, MessageReceived):
            if _usable(event.link) and not event.delivery.settled:
                engine.settle(event.delivery, Accepted())
            partner = _session(event.link).names.get((event.link.name, ROLE_SENDER))
            if partner is not None:
                self._offer(partner)
        elif isinstance(event, LinkFlow):
            self._offer(event.link)
        elif isinstance(event, DeliveryUpdated):
            delivery = event.delivery
            decided = delivery.remote_state is not None and not delivery.remote_settled
            if decided and not delivery.settled and _usable(event.link):
                engine.settle(delivery, delivery.remote_state)

    def _offer(self, link: Link) -> None:
        """Send what the budget, the credit and the bound on unsettled deliveries allow on a
        sending link; then answer a drain."""
        if not (link.is_sender and _usable(link)):
            return
        engine = self.engine
        limit = link.remote_max_message_size
        fits = limit is None or len(self._message) <= limit
        while fits and self._budget > 0 and not link.send_blocked:
            self._budget -= 1
            engine.send(link, self._message)
        if link.drain and link.link_credit > 0:
            engine.complete_drain(link)


def _session(link: Link) -> Session:
    """The engine's session of ``link`` (a link sees only the part of it that it calls)."""
    session = link.session
    assert isinstance(session, Session)
    return session


def _usable(link: Link) -> bool:
    return link.state is LinkState.ATTACHED and _session(link).state is SessionState.MAPPED


def run_engine(data: bytes) -> list[Event]:
    """Target 1: the input into a listener's engine, with the container's answers; returns
    the engine's events."""
    mode, body = split_input(data)
    harness = EngineHarness(engine_config(mode.small))
    harness.tick(0.0)
    for piece in mode.pieces(prefix(mode.stage, plain=False) + body):
        harness.feed(piece)
        harness.drain_output()
    harness.tick(mode.wait)
    harness.events += harness.engine.connection_lost()
    harness.drain_output()
    frames = read_output(bytes(harness.sent), messages=False)
    violations = [e for e in harness.events if isinstance(e, ProtocolViolation)]
    said_amqp = AMQP_HEADER in harness.sent
    if violations and said_amqp and not any(isinstance(f, Close) for f in frames):
        raise Failure(f"{violations[0]} was not answered with a close")
    return harness.events


# -- the peer's prefix ---------------------------------------------------------------------------


class ScriptedPeer:
    """A well-behaved client engine talking to an :class:`EngineHarness`: what it says up to a
    stage is that stage's prefix, and ``fuzz.seeds`` goes on from there with real frames."""

    def __init__(self, *, plain: bool, small: bool = False) -> None:
        sasl = SaslClient.plain(USER, PASSWORD) if plain else SaslClient.anonymous()
        config = ConnectionConfig(PEER_ID, sasl=sasl, desired_capabilities=[LINK_PAIR_V1_0])
        self.engine = Connection(config, initiator=True)
        self.server = EngineHarness(engine_config(small))
        self.sent = bytearray()
        self.session: Session | None = None
        self.sender: Link | None = None
        self.receiver: Link | None = None

    def exchange(self) -> list[Event]:
        """Move bytes both ways until both ends are quiet, keeping what the peer said;
        returns what it heard."""
        heard: list[Event] = []
        for _ in range(32):
            out = self.engine.data_to_send()
            self.sent += out
            if out:
                self.server.feed(out)
            back = self.server.drain_output()
            if not out and not back:
                return heard
            heard += self.engine.receive_data(back)
        raise RuntimeError("the scripted peer and the harness kept talking")

    def advance(self, stage: Stage) -> None:
        """Say what a client says up to ``stage``; the stages' own order."""
        self.exchange()  # SASL, then the AMQP header
        if stage >= Stage.OPEN:
            self.engine.open()
            self.exchange()
        if stage >= Stage.PAIR:
            self.session = self.pair(SERVICE)
            self.exchange()

    def pair(self, address: str | None, name: str = "pair-fuzz-1") -> Session:
        """Begin a session (the first time) and attach a pair to ``address`` (None: the
        routing node's anonymous terminus, LP-9), granting reply credit, as our client does."""
        engine = self.engine
        session = self.session or engine.begin()
        self.sender = engine.attach(
            session,
            name=name,
            role=ROLE_SENDER,
            source=Source(address=name),
            target=Target(address=address),
            properties=paired_properties(),
        )
        self.receiver = engine.attach(
            session,
            name=name,
            role=ROLE_RECEIVER,
            source=Source(address=address),
            target=Target(address=name),
            properties=paired_properties(),
        )
        engine.flow(self.receiver, 100)
        return session


@functools.cache
def prefix(stage: Stage, *, plain: bool) -> bytes:
    """What a well-behaved peer says up to ``stage`` (SASL PLAIN as ``USER`` when ``plain``,
    else ANONYMOUS)."""
    if stage is Stage.RAW:
        return b""
    peer = ScriptedPeer(plain=plain)
    peer.advance(stage)
    return bytes(peer.sent)


def peer_bytes(data: bytes, *, plain: bool) -> bytes:
    """Everything the peer of an input sends: the stage's prefix, then the fuzzed bytes."""
    mode, body = split_input(data)
    return prefix(mode.stage, plain=plain) + body


# -- reading our output --------------------------------------------------------------------------


def read_output(data: bytes, *, messages: bool) -> list[Any]:
    """Decode what our side sent: protocol headers, then frames, every one of which our own
    decoder must read (and, with ``messages``, every message our transfers carry). Raises
    :class:`Failure` for anything unreadable, a frame after our close and an
    ``amqp:internal-error`` condition; returns the performatives."""
    performatives: list[Any] = []
    partial: dict[tuple[int, int], bytearray] = {}
    pos = 0
    while pos < len(data):
        if data.startswith(b"AMQP", pos):
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size < 8 or pos + size > len(data):
            raise Failure(f"our output has a broken frame at byte {pos}: {data[pos : pos + 16]!r}")
        reader = FrameReader()
        reader.feed(data[pos : pos + size])
        try:
            frame = reader.read_frame()
        except Exception as exc:
            raise Failure(f"our own frame at byte {pos} does not decode: {exc!r}") from exc
        assert frame is not None, "FrameReader was fed a whole frame"
        pos += size
        perf = frame.performative
        if performatives and isinstance(performatives[-1], Close):
            raise Failure(f"we sent {perf!r} after our close (None: a heartbeat)")
        if perf is None:
            continue  # a heartbeat
        performatives.append(perf)
        if isinstance(perf, Close | End | Detach) and perf.error is not None:
            _check_condition(perf.error)
        if messages and isinstance(perf, Transfer):
            key = (frame.channel, perf.handle)
            buffered = partial.setdefault(key, bytearray())
            buffered += frame.payload
            if not perf.more:
                del partial[key]
                if not perf.aborted:
                    _check_message(bytes(buffered))
    return performatives


def _check_condition(error: Error) -> None:
    if str(error.condition) == INTERNAL_ERROR:
        raise Failure(f"our side closed with {error.condition}: {error.description}")


def _check_message(payload: bytes) -> None:
    try:
        Message.decode(payload)
    except Exception as exc:
        raise Failure(f"a message we sent does not decode: {exc!r}: {payload[:64]!r}") from exc


# -- the container and gateway targets -----------------------------------------------------------


@contextmanager
def errors_logged() -> Iterator[list[MutableMapping[str, Any]]]:
    """Keep the error log events (and nothing else) of the block; logging is restored after."""
    caught: list[MutableMapping[str, Any]] = []

    def keep(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Any:
        caught.append(event)
        raise structlog.DropEvent

    saved = structlog.get_config()
    structlog.configure(
        processors=[keep],
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        cache_logger_on_first_use=False,
    )
    try:
        yield caught
    finally:
        structlog.configure(**saved)


def check_logged(caught: list[MutableMapping[str, Any]]) -> None:
    """Raise :class:`Failure` for the first error event that is not ``EXPECTED_ERRORS``,
    with the traceback it logged."""
    failures = [e for e in caught if e.get("event") not in EXPECTED_ERRORS]
    if not failures:
        return
    first = dict(failures[0])
    exc = first.pop("exc_info", None)
    where = "".join(traceback.format_exception(exc)) if isinstance(exc, BaseException) else ""
    raise Failure(f"an error was logged: {first}\n{where}")


async def converse(data: bytes, mode: Mode, config: ConnectionConfig, on_attach: OnAttach) -> bytes:
    """Run our side of one connection over an in-memory stream, as a listener runs it, with
    the input as the peer: its bytes in the mode's pieces (our side may go quiet after each),
    the mode's silence, then its EOF. Returns everything our side said."""
    peer, ours = trio.testing.memory_stream_pair()
    heard = bytearray()

    async def speak() -> None:
        try:
            for piece in mode.pieces(data, MAX_PIECES):
                await peer.send_all(piece)
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(mode.wait)
            await peer.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # our side hung up first

    async def listen() -> None:
        while chunk := await peer.receive_some():
            heard.extend(chunk)

    async def serve() -> None:
        try:
            async with open_connection(
                ours, config, initiator=False, peer="fuzzer", on_attach=on_attach
            ) as conn:
                await conn.closed.wait()
        except trio.BrokenResourceError:
            pass  # a listener absorbs a broken socket the same way

    async with trio.open_nursery() as nursery:
        nursery.start_soon(speak)
        nursery.start_soon(listen)
        nursery.start_soon(serve)
    return bytes(heard)


def _run_trio(main: Callable[[], Awaitable[bytes]], *, autojump: float = 0.0) -> bytes:
    """One input's run on a clock that jumps once every task has waited ``autojump`` real
    seconds, within ``RUN_LIMIT`` virtual and ``REAL_LIMIT`` real seconds; the errors logged
    meanwhile and what our side said are checked."""

    async def bounded() -> bytes:
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as real:
            timer = threading.Timer(REAL_LIMIT, token.run_sync_soon, args=(real.cancel,))
            timer.daemon = True
            timer.start()
            try:
                with trio.move_on_after(RUN_LIMIT):
                    return await main()
            finally:
                timer.cancel()
            raise Failure(f"the run did not end within {RUN_LIMIT:g} virtual seconds (a hang)")
        raise Failure(f"the run took over {REAL_LIMIT:g} real seconds (a task that never sleeps?)")

    with errors_logged() as caught:
        heard = trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=autojump))
    check_logged(caught)
    read_output(heard, messages=True)
    return heard


def run_container(data: bytes) -> bytes:
    """Target 2: the input as a peer of a real service container (the echo service);
    returns what the container said."""
    mode, body = split_input(data)

    async def main() -> bytes:
        async with open_server(
            Echo, listen=LOOPBACK, grace=GRACE, container_id=CONTAINER_ID
        ) as server:
            config = server_config(
                container_id=server.container_id,
                sasl=SaslServer.with_users({}, allow_anonymous=True),
                idle_timeout=CONTAINER_IDLE,
                small=mode.small,
            )
            talk = prefix(mode.stage, plain=False) + body
            assert server.listener is not None
            return await converse(talk, mode, config, server.listener.on_attach)

    return _run_trio(main)


def gateway_config(upstream: str) -> GatewayConfig:
    """The fuzzed gateway: PLAIN users only, a route to the echo service that ``USER`` may
    use and one that only ``STRANGER`` may."""
    return GatewayConfig(
        listen=LOOPBACK,
        routes=(
            Route(public=SERVICE, upstream=upstream, address=SERVICE),
            Route(
                public=PRIVATE_ROUTE,
                upstream=upstream,
                address=SERVICE,
                allow=frozenset({STRANGER}),
            ),
        ),
        users={USER: PASSWORD, STRANGER: "stranger-password"},
        container_id="fuzz-gateway",
        idle_timeout=GATEWAY_IDLE,
    )


def run_gateway(data: bytes) -> bytes:
    """Target 3: the input as a downstream peer of a real gateway whose route leads to a real
    container (the echo service) over TCP; returns what the gateway said downstream."""
    mode, body = split_input(data)

    async def main() -> bytes:
        async with open_server(Echo, listen=LOOPBACK, grace=GRACE) as server:
            gw_config = gateway_config(server.url)
            async with open_gateway(gw_config) as gateway:
                await _upstream_up(gateway)
                assert gw_config.users is not None
                config = server_config(
                    container_id=gateway.container_id,
                    sasl=SaslServer.with_users(gw_config.users),
                    idle_timeout=gw_config.idle_timeout,
                    small=mode.small,
                )
                talk = prefix(mode.stage, plain=True) + body
                assert gateway.listener is not None
                return await converse(talk, mode, config, gateway.listener.on_attach)

    return _run_trio(main, autojump=GATEWAY_AUTOJUMP)


async def _upstream_up(gateway: Gateway) -> None:
    """Wait until the gateway's connection to the container is up, so that its handshake (real
    TCP) is over before the peer's first timer could make the clock jump past it."""
    (upstream,) = gateway.upstreams[SERVICE].upstreams
    while True:
        try:
            await upstream.connection()
            return
        except UpstreamUnavailable:
            await trio.sleep(UPSTREAM_RETRY)


TARGETS: dict[str, Callable[[bytes], object]] = {
    "engine": run_engine,
    "container": run_container,
    "gateway": run_gateway,
}
"""The fuzz targets by name: ``python -m fuzz.fuzzer NAME``."""
