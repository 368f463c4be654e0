"""The seed corpus: real peers' bytes, cut to the fuzz targets' stages.

    python -m fuzz.seeds        # rewrites fuzz/corpus/seeds/{direct,gateway}/

Two kinds of source, both real frames:

* our own client (``pairlink._client.client``) and Qpid Proton's ``BlockingConnection``, recorded
  through a TCP tap in front of a real echo container (and, for the gateway, in front of a
  real gateway routing to it), whole (stage RAW) and cut after SASL and after the open;
* scripted sessions of a client engine (``fuzz.targets.ScriptedPeer``) that reach what the
  recordings do not: pipelined requests in every body encoding, multi-frame messages under
  small limits, drains, the peer's dispositions, detach/end/close, the routing node's
  anonymous terminus (LP-9), the classic dynamic reply node, and each kind of refusal.

Recordings carry the clients' random container ids, so a new run writes different (equally
good) bytes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import trio
from proton import Message as ProtonMessage
from proton.utils import BlockingConnection

from fuzz import seed_folder
from fuzz.targets import (
    CONTAINER_ID,
    PASSWORD,
    PRIVATE_ROUTE,
    SERVICE,
    USER,
    WAITS,
    Mode,
    ScriptedPeer,
    Stage,
    gateway_config,
)
from pairlink import Client, connect, open_server
from pairlink._amqp.events import MessageReceived
from pairlink._amqp.framing import AMQP_HEADER
from pairlink._amqp.messaging import Accepted, Source, Target
from pairlink._amqp.performatives import RCV_SECOND, ROLE_RECEIVER, ROLE_SENDER, SND_UNSETTLED
from pairlink._rpc.linkpair import paired_properties
from pairlink._rpc.payload import Encoding
from pairlink._rpc.wire import encode_request, request_message
from pairlink.errors import RemoteError
from pairlink.gateway import open_gateway
from services.echo import Echo

Seeds = dict[str, bytes]
"""Seed inputs by file name (the mode byte included)."""


# -- recordings ----------------------------------------------------------------------------------


async def _pipe(
    source: trio.abc.Stream, sink: trio.abc.Stream, keep: bytearray | None = None
) -> None:
    """Copy until EOF (then pass the EOF on), keeping a copy of what went by."""
    try:
        while data := await source.receive_some():
            if keep is not None:
                keep += data
            await sink.send_all(data)
        await sink.send_eof()  # type: ignore[attr-defined]  # SocketStream has it
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _recorded(port: int, session: Callable[[int], Awaitable[None]]) -> bytes:
    """What ``session(tap_port)`` sends to the server at ``port``, through a tap."""
    recorded = bytearray()

    async def relay(down: trio.SocketStream) -> None:
        up = await trio.open_tcp_stream("127.0.0.1", port)
        async with down, up, trio.open_nursery() as nursery:
            nursery.start_soon(_pipe, up, down)
            await _pipe(down, up, recorded)

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        tap = listeners[0].socket.getsockname()[1]
        await nursery.start(trio.serve_listeners, relay, listeners)
        await session(tap)
        await trio.sleep(0.2)  # the last frames (our close) pass the tap
        nursery.cancel_scope.cancel()
    return bytes(recorded)


async def _client_calls(client: Client) -> None:
    """One call in each body encoding, a slow one and a refused one."""
    echo = await client.service(SERVICE)
    await echo.echo("hi")
    await echo.echo({"nested": [1, 2.5, None, b"\x00\xff", True]})
    await echo.sleep(0.01)
    for encoding in (Encoding.AMQP_VALUE, Encoding.JSON):
        proxy = await client.service(SERVICE, encoding=encoding)
        await proxy.echo(["a", 1])
    with contextlib.suppress(RemoteError):  # a 404 is the point of this call
        await client.call(SERVICE, "no-such-operation")


def _our_client(url: str, *, settled: bool) -> Callable[[int], Awaitable[None]]:
    async def session(port: int) -> None:
        async with connect(url.format(port=port), timeout=None, settled=settled) as client:
            await _client_calls(client)

    return session


async def _proton_client(port: int) -> None:
    """Qpid Proton's blocking client: a sender, a dynamic reply node, one call."""

    def run() -> None:
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
        try:
            receiver = conn.create_receiver(None, dynamic=True)
            sender = conn.create_sender(SERVICE)
            address = receiver.link.remote_source.address
            request = ProtonMessage(
                body=["hi"], reply_to=address, properties={"operation": "echo"}, id="p-1"
            )
            sender.send(request)
            receiver.receive(timeout=10)  # pre-settled: nothing to accept
        finally:
            conn.close()

    await trio.to_thread.run_sync(run)


def cut(recording: bytes, stage: Stage) -> bytes:
    """The part of a recorded session that follows ``stage`` (RAW: all of it)."""
    if stage is Stage.RAW:
        return recording
    at = recording.index(AMQP_HEADER, 8) + 8 if recording.startswith(b"AMQP\x03") else 8
    if stage is Stage.SASL:
        return recording[at:]
    return recording[at + int.from_bytes(recording[at : at + 4], "big") :]


def _cuts(name: str, recording: bytes) -> Seeds:
    return {
        f"{name}-{stage.name.lower()}": bytes([Mode(stage=stage).byte()]) + cut(recording, stage)
        for stage in (Stage.RAW, Stage.SASL, Stage.OPEN)
    }


async def _recordings() -> tuple[Seeds, Seeds]:
    """(seeds for the engine and the container, seeds for the gateway)."""
    direct: Seeds = {}
    through: Seeds = {}
    async with open_server(Echo, listen="amqp://127.0.0.1:0", container_id=CONTAINER_ID) as server:
        for settled in (True, False):
            session = _our_client("amqp://127.0.0.1:{port}", settled=settled)
            name = "client-" + ("settled" if settled else "unsettled")
            direct |= _cuts(name, await _recorded(server.port, session))
        direct |= _cuts("proton", await _recorded(server.port, _proton_client))
        async with open_gateway(gateway_config(server.url)) as gateway:
            session = _our_client(f"amqp://{USER}:{PASSWORD}@127.0.0.1:{{port}}", settled=True)
            through |= _cuts("client-via-gateway", await _recorded(gateway.port, session))
    return direct, through


# -- scripted sessions ---------------------------------------------------------------------------


def _request(operation: str, args: list[Any], encoding: Encoding, n: int, **extra: Any) -> bytes:
    return encode_request(
        operation, args, {}, message_id=n, now=time.time(), encoding=encoding, **extra
    )


def _continue(peer: ScriptedPeer, act: Callable[[ScriptedPeer], None], mode: Mode) -> bytes:
    """The mode byte, then what ``peer`` says (past its stage) while doing ``act``."""
    start = len(peer.sent)
    act(peer)
    peer.exchange()
    return bytes([mode.byte()]) + bytes(peer.sent[start:])


def _requests(peer: ScriptedPeer) -> None:
    assert peer.sender is not None
    engine = peer.engine
    engine.send(peer.sender, _request("echo", ["hi"], Encoding.ENVELOPE, 1), settled=True)
    engine.send(peer.sender, _request("echo", [[1, "x"]], Encoding.AMQP_VALUE, 2), settled=False)
    engine.send(peer.sender, _request("echo", [{"k": None}], Encoding.JSON, 3))
    engine.send(peer.sender, _request("sleep", [5.0], Encoding.ENVELOPE, 4, timeout=1.0))
    engine.send(peer.sender, _request("missing", [], Encoding.ENVELOPE, 5))


def _large_request(peer: ScriptedPeer) -> None:
    assert peer.sender is not None
    peer.engine.send(peer.sender, _request("echo", ["x" * 1500], Encoding.ENVELOPE, 1))


def _settle_and_drain(peer: ScriptedPeer) -> None:
    """A request, the peer accepting what comes back (it settles second), then a drain."""
    assert peer.sender is not None and peer.receiver is not None
    engine = peer.engine
    engine.send(peer.sender, _request("echo", [7], Encoding.ENVELOPE, 1), settled=False)
    for event in peer.exchange():
        if isinstance(event, MessageReceived):
            engine.settle(event.delivery, Accepted(), settled=False)
    engine.flow(peer.receiver, 3, drain=True)


def _goodbye(peer: ScriptedPeer) -> None:
    assert peer.session is not None and peer.sender is not None and peer.receiver is not None
    engine = peer.engine
    engine.send(peer.sender, _request("echo", [0], Encoding.ENVELOPE, 1))
    engine.detach(peer.sender)
    engine.detach(peer.receiver)
    engine.end(peer.session)
    engine.close()


def _routing_node(peer: ScriptedPeer) -> None:
    """LP-9: a pair with anonymous termini, requests addressed by ``to``."""
    peer.session = peer.pair(None, name="pair-routed")
    assert peer.sender is not None
    for n, to in enumerate((SERVICE, "nowhere"), 1):
        message = request_message("echo", ["routed"], {}, message_id=n, now=time.time())
        assert message.properties is not None
        message.properties.to = to
        peer.engine.send(peer.sender, message.encode(), presume_credit=True)


def _classic(peer: ScriptedPeer) -> None:
    """The AMQP-management pattern: a dynamic reply node, requests that name it in reply-to
    (the fuzzed container's name is fixed, and so is the address of its first dynamic node)."""
    engine = peer.engine
    session = peer.session = engine.begin()
    replies = engine.attach(
        session,
        name="replies",
        role=ROLE_RECEIVER,
        source=Source(dynamic=True),
        target=Target(),
        rcv_settle_mode=RCV_SECOND,
    )
    engine.flow(replies, 10)
    requests = engine.attach(
        session,
        name="requests",
        role=ROLE_SENDER,
        source=Source(),
        target=Target(address=SERVICE),
        snd_settle_mode=SND_UNSETTLED,
    )
    reply_to = f"{CONTAINER_ID}/dyn/1"
    payload = _request("echo", ["classic"], Encoding.AMQP_VALUE, 1, reply_to=reply_to)
    engine.send(requests, payload, presume_credit=True)


def _refusals(peer: ScriptedPeer) -> None:
    """One attach of each kind a responder refuses: an unknown address, a route only another
    user may take, a link that is not paired, a pair whose halves do not mirror."""
    for n, address in enumerate(("nowhere", PRIVATE_ROUTE)):
        peer.session = peer.pair(address, name=f"refused-{n}")
    engine = peer.engine
    assert peer.session is not None
    engine.attach(
        peer.session,
        name="unpaired",
        role=ROLE_SENDER,
        source=Source(address="me"),
        target=Target(address=SERVICE),
    )
    for role, source, target in ((ROLE_SENDER, "me", SERVICE), (ROLE_RECEIVER, "elsewhere", "me")):
        engine.attach(
            peer.session,
            name="mismatched",
            role=role,
            source=Source(address=source),
            target=Target(address=target),
            properties=paired_properties(),
        )


def scripted(*, plain: bool) -> Seeds:
    """Scripted sessions, past the stage where each starts."""
    pair, opened = Mode(stage=Stage.PAIR), Mode(stage=Stage.OPEN)
    small = Mode(stage=Stage.PAIR, small=True)
    quiet = Mode(stage=Stage.PAIR, wait=WAITS[-1])
    sessions: list[tuple[str, Mode, Callable[[ScriptedPeer], None]]] = [
        ("pair-requests", pair, _requests),
        ("pair-requests-split", Mode(stage=Stage.PAIR, split=7), _requests),
        ("pair-large-small-limits", small, _large_request),
        ("pair-settle-drain", pair, _settle_and_drain),
        ("pair-goodbye", pair, _goodbye),
        ("pair-then-silence", quiet, _requests),
        ("open-routing-node", opened, _routing_node),
        ("open-classic", opened, _classic),
        ("pair-refusals", pair, _refusals),
    ]
    seeds: Seeds = {}
    for name, mode, act in sessions:
        peer = ScriptedPeer(plain=plain, small=mode.small)
        peer.advance(mode.stage)
        seeds[name] = _continue(peer, act, mode)
    return seeds


def write(folder: Path, seeds: Seeds) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for name, data in seeds.items():
        (folder / name).write_bytes(data)


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    direct, through = trio.run(_recordings)
    written = {
        seed_folder("container"): direct | scripted(plain=False),
        seed_folder("gateway"): through | scripted(plain=True),
    }
    for folder, seeds in written.items():
        write(folder, seeds)
        print(f"{folder}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")


if __name__ == "__main__":
    main()
