"""Issue 9 §5: a gateway carries as many pairs as configured and never dies of load.

Each pair takes two link handles on a session (handle-max 1023: 512 pairs a session). Before
this, the 513th concurrent pair from one client made GN's engine raise ``LocalProtocolError``
("no free link handle") in the task pairing upstream, which ended the whole gateway. Now GN
puts pairs on as many upstream sessions (and connections, when the next hop's channel-max is
reached) as they need, up to ``max_pairs``, past which a new pair is refused with
``amqp:resource-limit-exceeded``. All through the real chain over TCP on 127.0.0.1.
"""

from __future__ import annotations

import logging
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from pairlink import connect, hosted, open_server
from pairlink._amqp import errors as conditions
from pairlink._amqp.connection import Connection
from pairlink._amqp.events import ConnectionOpened
from pairlink._amqp.framing import FrameReader, encode_frame
from pairlink._amqp.messaging import Rejected, Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Begin, Close, Detach, End
from pairlink._amqp.session import Session
from pairlink._io import net
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import Receiver, Sender
from pairlink._rpc import wire
from pairlink.errors import LinkDetachedError
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from services.echo import Echo
from tests.gateway.chain import (
    APPS_USER,
    CLIENT_ID,
    GUEST_PASSWORD,
    GUEST_USER,
    INTERNAL,
    LOOPBACK,
    PUBLIC,
    SLOW,
    ByteTap,
    Chain,
    attach_pair,
    echo_on,
    open_chain,
    routed_request,
    wait_until,
)
from tests.test_client_cli import Served


@pytest.fixture
async def chain() -> AsyncIterator[Chain]:
    async with open_chain() as c:
        yield c


@pytest.fixture
def info_logs() -> Iterator[None]:
    """Log at info level: thousands of pairs make a debug line per link at every hop, and
    formatting them cost more than relaying the pairs."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    yield
    structlog.configure(**saved)


PAIRS_PER_SESSION = 500
"""Pairs a test client puts on one of its sessions (1,000 of its 1,024 handles)."""


def open_pairs(conn: AmqpConnection, count: int, prefix: str) -> list[tuple[Sender, Receiver]]:
    """``count`` pairs on as many sessions of ``conn`` as they need, all pipelined."""
    pairs = []
    session: Session | None = None
    for i in range(count):
        if i % PAIRS_PER_SESSION == 0:
            session = conn.session if i == 0 else conn.begin()
            assert session is not None
        pairs.append(attach_pair(conn, f"{prefix}-{i}", session=session))
    return pairs


async def echo_on_all(pairs: list[tuple[Sender, Receiver]]) -> dict[int, Any]:
    """One call on every pair, all at once; the replies by pair. Each call's deadline is
    generous: the last pairs wait for all the attaches before theirs on a busy machine (the
    test's own time bound is what fails a slow run)."""
    replies: dict[int, Any] = {}

    async def one(i: int, sender: Sender, receiver: Receiver) -> None:
        replies[i] = await echo_on(sender, receiver, i, deadline=120)

    async with trio.open_nursery() as nursery:
        for i, (sender, receiver) in enumerate(pairs):
            nursery.start_soon(one, i, sender, receiver)
    return replies


BEGIN, ATTACH, DETACH = 0x11, 0x12, 0x16
"""Descriptor codes of the performatives these tests count (transport.xml)."""


def frames_of(data: bytearray, codes: set[int]) -> list[tuple[int, Any]]:
    """The performatives in one direction of one connection through a tap whose descriptor
    code is in ``codes``, with their channels. The code is read before decoding: the flows,
    transfers and dispositions of thousands of pairs are many, and cost time to decode."""
    frames = []
    reader = FrameReader()
    pos = 0
    while pos + 8 <= len(data):
        if data[pos : pos + 4] == b"AMQP":  # a protocol header
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        body = pos + 4 * data[pos + 4]
        # an AMQP frame (type 0) whose body starts 0x00 0x53 <code>: a small-ulong descriptor
        if data[pos + 5] == 0 and size > body - pos + 2 and data[body + 2] in codes:
            reader.feed(bytes(data[pos : pos + size]))
            frame = reader.read_frame()
            assert frame is not None
            frames.append((frame.channel, frame.performative))
        pos += size
    return frames


def of(frames: list[tuple[int, Any]], kind: type) -> list[tuple[int, Any]]:
    return [(channel, f) for channel, f in frames if isinstance(f, kind)]


def upstream_links(gateway: Gateway) -> int:
    """Links open on the gateway's upstream sessions, over every next hop."""
    upstreams = {u for replicas in gateway.upstreams.values() for u in replicas.upstreams}
    return sum(len(s.links) for u in upstreams for ss in u.sessions.values() for s in ss)


# -- thousands of pairs -------------------------------------------------------------------------

THOUSANDS = 2000


@pytest.mark.usefixtures("info_logs")
async def test_lp11_thousands_of_concurrent_pairs_through_the_chain_are_all_answered() -> None:
    # CO's echo holds a call for each pair: its mailbox bounds the credit callers get at once
    async with open_chain(echo_mailbox=2 * THOUSANDS) as chain:
        gn, go = chain.gn.gateway, chain.go.gateway
        assert gn is not None and go is not None
        with trio.fail_after(40):
            async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
                pairs = open_pairs(conn, THOUSANDS, "many")
                replies = await echo_on_all(pairs)
                assert replies == {i: i for i in range(THOUSANDS)}
                assert gn.pairs.used == go.pairs.used == THOUSANDS
            # the client left: every pair is over at each gateway, nothing left counted, and
            # no link left on the upstream sessions (each upstream pair was detached)
            await wait_until(lambda: gn.pairs.used == go.pairs.used == 0, within=20)
            await wait_until(lambda: upstream_links(gn) == upstream_links(go) == 0, within=20)

    for tap in (chain.gn_go, chain.go_co):
        # two connections per hop: the gateway's main one, which carries no pair, and the
        # client's lane, its pairs on 4 sessions of 512 pairs at most (1,024 handles)
        main, connection = tap.connections
        assert not of(frames_of(main.up, {ATTACH}), Attach)
        sent = frames_of(connection.up, {BEGIN, ATTACH})
        answered = frames_of(connection.down, {ATTACH, DETACH})
        assert len(of(sent, Begin)) == 4, tap
        attaches = of(sent, Attach)
        per_session = Counter(channel for channel, _ in attaches)
        assert sorted(per_session) == [0, 1, 2, 3], tap
        assert max(per_session.values()) == 1024, per_session
        assert len(attaches) == 2 * THOUSANDS
        assert len({a.name for _, a in attaches}) == THOUSANDS
        assert max(a.handle for _, a in attaches) <= 1023
        # every upstream pair was answered, none refused (a refusal has a null terminus)
        answers = [a for _, a in of(answered, Attach)]
        assert len(answers) == 2 * THOUSANDS
        assert all((a.source if a.role is ROLE_SENDER else a.target) is not None for a in answers)
        assert not [d for _, d in of(answered, Detach) if d.error is not None]


@pytest.mark.usefixtures("info_logs")
async def test_lp11_pairs_past_the_next_hops_channel_max_open_another_connection() -> None:
    """A next hop that allows one session per connection (channel-max 0): GN opens another
    connection for the client once the first one's session is full (512 pairs)."""
    pairs_wanted = 600
    async with trio.open_nursery() as nursery:
        async with open_server(
            hosted(Echo, address=INTERNAL, mailbox=2 * pairs_wanted),
            listen=f"amqp://{LOOPBACK}:0",
            container_id="co",
            grace=1,
            channel_max=0,
        ) as co:
            tap: ByteTap = await nursery.start(ByteTap("gn-co", co.port).run)
            config = GatewayConfig(
                listen=f"amqp://{LOOPBACK}:0",
                routes=(Route(public=PUBLIC, upstream=tap.url, address=INTERNAL),),
                container_id="gn",
                attach_timeout=5.0,
            )
            async with open_gateway(config) as gn:
                with trio.fail_after(30):
                    async with net.connect(gn.url, container_id=CLIENT_ID) as conn:
                        pairs = open_pairs(conn, pairs_wanted, "wide")
                        replies = await echo_on_all(pairs)
                        assert replies == {i: i for i in range(pairs_wanted)}
                    await wait_until(lambda: gn.pairs.used == 0, within=20)
        nursery.cancel_scope.cancel()
    assert len(tap.connections) == 3  # GN's main connection, and the client's lane of two
    sent = [frames_of(c.up, {BEGIN, ATTACH}) for c in tap.connections]
    assert [len(of(frames, Begin)) for frames in sent] == [1, 1, 1]
    assert [len(of(frames, Attach)) for frames in sent] == [0, 1024, 2 * (pairs_wanted - 512)]


# -- max_pairs ----------------------------------------------------------------------------------


async def test_lp11_past_max_pairs_a_new_pair_is_refused_and_the_others_keep_working() -> None:
    limit = 6
    async with (
        open_chain(gn_max_pairs=limit) as chain,
        net.connect(chain.url, container_id=CLIENT_ID) as conn,
    ):
        gn = chain.gn.gateway
        assert gn is not None
        kept = [attach_pair(conn, f"kept-{i}") for i in range(limit)]
        with trio.fail_after(10):
            for sender, receiver in kept:
                await sender.attached.wait()
                await receiver.attached.wait()
        assert gn.pairs.used == limit

        sender, receiver = attach_pair(conn, "one-too-many")
        with trio.fail_after(10):
            with pytest.raises(LinkDetachedError) as refused:
                await sender.take_credit()
            with pytest.raises(LinkDetachedError) as refused_too:
                await receiver.receive()
        for caught in (refused, refused_too):
            assert caught.value.condition == conditions.RESOURCE_LIMIT_EXCEEDED
            assert f"maximum of {limit} pairs" in str(caught.value)
        # both halves refused as every gateway refusal is: a null terminus, then the detach
        asked = {a.handle for a in chain.client_gn.up().attaches() if a.name == "one-too-many"}
        answers = [a for a in chain.client_gn.down().attaches() if a.name == "one-too-many"]
        assert len(asked) == 2 and len(answers) == 2
        for a in answers:
            assert (a.source if a.role is ROLE_SENDER else a.target) is None, a
        refusals = [
            d for d in chain.client_gn.down().of(Detach) if d.handle in {a.handle for a in answers}
        ]
        assert [d.error.condition for d in refusals if d.error] == [
            conditions.RESOURCE_LIMIT_EXCEEDED
        ] * 2
        assert all(d.closed for d in refusals)
        assert b"one-too-many" not in chain.gn_go.all_bytes()  # nothing went upstream

        # the pairs carried go on: a call on each
        with trio.fail_after(10):
            for i, pair in enumerate(kept):
                assert await echo_on(*pair, i) == i
        # our client sees the refusal as the condition, on its own pair
        async with connect(chain.url, container_id="another") as client:
            with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
                await client.call(PUBLIC, "echo", 1)
            assert caught.value.condition == conditions.RESOURCE_LIMIT_EXCEEDED

            # one pair ends: its place is free again, for the next caller
            kept[0][0].detach()
            kept[0][1].detach()
            await wait_until(lambda: gn.pairs.used == limit - 1)
            with trio.fail_after(10):
                assert await client.call(PUBLIC, "echo", 2) == 2
        assert gn.pairs.used == limit - 1  # the client's pair left with its connection


async def test_lp9_a_routing_node_and_each_of_its_legs_count_against_max_pairs() -> None:
    limit = 2  # the node, and one leg
    async with (
        open_chain(gn_max_pairs=limit) as chain,
        net.connect(chain.url, container_id=CLIENT_ID) as conn,
    ):
        chain.slow.gate.set()
        gn = chain.gn.gateway
        assert gn is not None
        sender, receiver = attach_pair(conn, "node", address=None, credit=10)
        with trio.fail_after(10):
            to_public = routed_request(1, PUBLIC, "echo")
            await sender.send(to_public, settled=True)
            assert wire.parse_reply((await receiver.receive()).message) == "routed-1"
            assert gn.pairs.used == limit
            # a second route needs a second leg: no place left, the request is rejected
            delivery = await sender.send(routed_request(2, SLOW, "hold"), settled=False)
        state = delivery.remote_state
        assert isinstance(state, Rejected) and state.error is not None
        assert state.error.condition == conditions.RESOURCE_LIMIT_EXCEEDED
        assert SLOW.encode() not in chain.gn_go.all_bytes()
        with trio.fail_after(10):  # the node and its first leg go on
            await sender.send(routed_request(3, PUBLIC, "echo"), settled=True)
            assert wire.parse_reply((await receiver.receive()).message) == "routed-3"
        # and a new pair is refused meanwhile
        other = attach_pair(conn, "other")
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
            await other[0].take_credit()
        assert caught.value.condition == conditions.RESOURCE_LIMIT_EXCEEDED
        sender.detach()
        receiver.detach()
        await wait_until(lambda: gn.pairs.used == 0)


# -- memory -------------------------------------------------------------------------------------

MEMORY_PAIRS = 1000
PAIR_MEMORY_BOUND = 32 * 1024
"""Bytes of gateway RSS one relayed pair may cost here: ~13 KiB measured (README), with room
for the allocator's granularity and a noisy machine."""


def rss(pid: int) -> int:
    """A process's resident set size in bytes, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
    assert match is not None, status
    return int(match.group(1)) * 1024


async def refused(pair: tuple[Sender, Receiver]) -> LinkDetachedError:
    """The error a refused pair's sender is detached with."""
    sender, _receiver = pair
    with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
        await sender.take_credit()
    return caught.value


async def attached(pairs: list[tuple[Sender, Receiver]]) -> None:
    with trio.fail_after(10):
        for sender, receiver in pairs:
            await sender.attached.wait()
            await receiver.attached.wait()


async def test_a_routing_node_is_only_for_users_some_route_allows() -> None:
    async with (
        open_chain() as chain,
        net.connect(chain.url_as(GUEST_USER, GUEST_PASSWORD)) as guest,
    ):
        gn = chain.gn.gateway
        assert gn is not None
        error = await refused(attach_pair(guest, "node", address=None))
        assert error.condition == conditions.UNAUTHORIZED_ACCESS
        assert f"{GUEST_USER} may use no route of this gateway" in str(error)
        assert gn.pairs.used == 0


async def test_one_user_and_one_connection_hold_their_share_of_max_pairs_only() -> None:
    """With ``max_pairs`` 8, a connection holds 2 pairs at most (a quarter) and a user 4 (a
    half): the gateway's last places stay for the other parties."""
    async with (
        open_chain(gn_max_pairs=8, gn_pair_shares=True) as chain,
        net.connect(chain.url) as first,
        net.connect(chain.url) as second,
    ):
        gn = chain.gn.gateway
        assert gn is not None
        await attached([attach_pair(first, f"first-{i}") for i in range(2)])
        error = await refused(attach_pair(first, "first-2"))
        assert error.condition == conditions.RESOURCE_LIMIT_EXCEEDED
        assert "one connection may hold 2 pairs at most" in str(error)
        await attached([attach_pair(second, f"second-{i}") for i in range(2)])
        assert gn.pairs.used == 4
        async with net.connect(chain.url) as third:
            error = await refused(attach_pair(third, "third-0"))
        assert f"{APPS_USER} may hold 4 pairs at most" in str(error)
        assert gn.pairs.used == 4  # half of the places are still free for other users


async def test_lp11_gateway_memory_per_pair_is_bounded(tmp_path: Path) -> None:
    """GN alone in a process (``pairlink gateway``), its RSS read from /proc before and after
    1,000 more pairs, each with one call done."""
    async with open_server(
        hosted(Echo, address=INTERNAL, mailbox=4 * MEMORY_PAIRS),
        listen=f"amqp://{LOOPBACK}:0",
        container_id="co",
        grace=1,
    ) as co:
        config = tmp_path / "gn.toml"
        config.write_text(
            f'listen = "amqp://{LOOPBACK}:0"\n'
            f"[[route]]\n"
            f'public = "{PUBLIC}"\n'
            f'upstream = "{co.url}"\n'
            f'address = "{INTERNAL}"\n'
        )
        with Served("--config", str(config), command="gateway") as gn:
            url = await trio.to_thread.run_sync(gn.url, "gateway.listening")
            with trio.fail_after(40):
                async with net.connect(url, container_id="warm-up") as conn:
                    replies = await echo_on_all(open_pairs(conn, 100, "warm"))
                    assert len(replies) == 100
                    before = rss(gn.process.pid)
                    async with net.connect(url, container_id=CLIENT_ID) as many:
                        pairs = open_pairs(many, MEMORY_PAIRS, "measured")
                        replies = await echo_on_all(pairs)
                        assert replies == {i: i for i in range(MEMORY_PAIRS)}
                        grown = rss(gn.process.pid) - before
            assert 0 < grown / MEMORY_PAIRS < PAIR_MEMORY_BOUND, grown / MEMORY_PAIRS
            assert await trio.to_thread.run_sync(gn.interrupt, signal.SIGTERM) == 0


# -- what one downstream peer may hold ------------------------------------------------------------


class RawPeer:
    """A downstream peer that logs in and opens through our engine, then writes frames by
    hand: what no well-behaved client sends."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader()

    @classmethod
    @asynccontextmanager
    async def connect(cls, url: str) -> AsyncIterator[RawPeer]:
        parsed = net.AmqpUrl.parse(url)
        stream = await trio.open_tcp_stream(parsed.host, parsed.port)
        async with stream:
            engine = Connection(net.client_config(parsed, container_id="raw-peer"), initiator=True)
            engine.open()
            opened = False
            while not opened:
                await stream.send_all(engine.data_to_send())
                data = await stream.receive_some(1 << 16)
                assert data, "the gateway hung up during the handshake"
                opened = any(isinstance(e, ConnectionOpened) for e in engine.receive_data(data))
            await stream.send_all(engine.data_to_send())
            yield cls(stream)

    async def send(self, channel: int, *performatives: Any) -> None:
        out = bytearray()
        for performative in performatives:
            encode_frame(out, channel, performative)
        await self.stream.send_all(out)

    async def frames_until(self, *kinds: type) -> list[Any]:
        """What the gateway sends, up to and including the first of one of ``kinds``."""
        seen: list[Any] = []
        while not seen or not isinstance(seen[-1], kinds):
            frame = self.reader.read_frame()
            if frame is None:
                data = await self.stream.receive_some(1 << 16)
                assert data, f"the gateway hung up first; it sent {seen[-3:]}"
                self.reader.feed(data)
            elif frame.performative is not None:
                seen.append(frame.performative)
        return seen


async def still_served(chain: Chain) -> None:
    """GN, GO and CO serve a new caller."""
    with trio.fail_after(10):
        async with connect(chain.url, container_id="later") as later:
            assert await later.call(PUBLIC, "echo", "after") == "after"


def new_session() -> Begin:
    return Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000)


def plain_attach(handle: int) -> Attach:
    """A sending link that is not paired: the gateway refuses it at once, and keeps the
    link's handle until the peer answers that detach (this peer never does)."""
    return Attach(
        name=f"plain-{handle}",
        handle=handle,
        role=ROLE_SENDER,
        source=Source(address=f"plain-{handle}"),
        target=Target(address=PUBLIC),
        initial_delivery_count=0,
    )


async def test_a_peer_past_its_sessions_is_closed_with_framing_error_and_gn_goes_on(
    chain: Chain,
) -> None:
    """Sessions: GN answers all 256 a peer may begin (channel-max 255); one more closes that
    connection alone with framing-error (Part 2 §2.7.1)."""
    async with connect(chain.url, container_id="bystander") as bystander:
        assert await bystander.call(PUBLIC, "echo", "before") == "before"
        with trio.fail_after(20):
            async with RawPeer.connect(chain.url) as peer:
                channels = 256
                for channel in range(channels):
                    await peer.send(channel, new_session())
                answers: list[Any] = []
                while len(answers) < channels:
                    answers += [f for f in await peer.frames_until(Begin) if isinstance(f, Begin)]
                assert sorted(f.remote_channel for f in answers) == list(range(channels))
                await peer.send(channels, new_session())  # one more
                close = (await peer.frames_until(Close))[-1]
        assert close.error is not None
        assert close.error.condition == conditions.FRAMING_ERROR
        await still_served(chain)
        assert await bystander.call(PUBLIC, "echo", "still") == "still"


async def test_a_peer_past_its_handles_is_closed_with_framing_error_and_gn_goes_on(
    chain: Chain,
) -> None:
    """Handles: GN holds a handle for each of 1,024 links a peer attaches on a session and
    never lets go (refused, their detaches unanswered); a handle past handle-max closes that
    connection alone with framing-error (Part 2 §2.7.2)."""
    async with connect(chain.url, container_id="bystander") as bystander:
        assert await bystander.call(PUBLIC, "echo", "before") == "before"
        with trio.fail_after(20):
            async with RawPeer.connect(chain.url) as peer:
                await peer.send(0, new_session())
                await peer.frames_until(Begin)
                handles = 1024
                await peer.send(0, *(plain_attach(h) for h in range(handles)))
                refused: list[Detach] = []
                while len(refused) < handles:
                    refused += [f for f in await peer.frames_until(Detach) if isinstance(f, Detach)]
                conditions_seen = {d.error.condition for d in refused if d.error}
                assert conditions_seen == {conditions.NOT_IMPLEMENTED}
                await peer.send(0, plain_attach(handles))  # a handle past handle-max
                close = (await peer.frames_until(Close))[-1]
        assert close.error is not None
        assert close.error.condition == conditions.FRAMING_ERROR
        await still_served(chain)
        assert await bystander.call(PUBLIC, "echo", "still") == "still"


async def test_a_peer_whose_handle_max_leaves_gn_no_handle_gets_a_condition_and_gn_goes_on(
    chain: Chain,
) -> None:
    """A peer that allows GN one handle (handle-max 0) and attaches two links: GN cannot
    answer the second within the peer's limit, and says so with a condition, not a crash."""
    async with connect(chain.url, container_id="bystander") as bystander:
        assert await bystander.call(PUBLIC, "echo", "before") == "before"
        with trio.fail_after(20):
            async with RawPeer.connect(chain.url) as peer:
                begin = new_session()
                begin.handle_max = 0
                await peer.send(0, begin, plain_attach(0), plain_attach(1))
                frames = await peer.frames_until(End, Close)
        ending = frames[-1]
        assert ending.error is not None and ending.error.condition, ending
        assert all(f.handle == 0 for f in frames if isinstance(f, Attach | Detach)), frames
        await still_served(chain)
        assert await bystander.call(PUBLIC, "echo", "still") == "still"
