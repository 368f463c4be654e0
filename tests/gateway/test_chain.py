"""Issue 4 §3: the gateway chain over real TCP on 127.0.0.1, asserted on the bytes.

client -> tap -> GN -> tap -> GO -> tap -> CO (echo at an internal address), all real peers:
our client, a Proton client, raw connections; CO also as a process that is killed. Tests are
named after the link-pairing rule they exercise (LP-11 propagation through gateways, LP-9 the
routing node). Every assertion is on frames, values or errors; time only bounds the waits.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from proton import Message as ProtonMessage

from pairlink import Client, connect, hosted, open_server
from pairlink._amqp import errors as conditions
from pairlink._amqp.messaging import Accepted, Error, Rejected
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Detach,
    Disposition,
    Flow,
)
from pairlink._io import net
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import Receiver, Sender, open_receiver, open_sender
from pairlink._rpc import wire
from pairlink._rpc.linkpair import is_paired, paired_properties
from pairlink.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    PairlinkError,
    RemoteError,
)
from services.echo import Echo
from tests.gateway.chain import (
    APPS_PASSWORD,
    APPS_USER,
    CLIENT_ID,
    GHOST,
    GHOST_INTERNAL,
    GUEST_PASSWORD,
    GUEST_USER,
    INTERNAL,
    LOOPBACK,
    PUBLIC,
    SLOW,
    SLOW_INTERNAL,
    SLOW_MAILBOX,
    ByteTap,
    Chain,
    Decoded,
    TapMessage,
    decode_stream,
    free_port,
    names_in,
    open_chain,
    requests_on,
    routed_request,
    wait_until,
)
from tests.interop.proton_peers import run_client

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def chain() -> AsyncIterator[Chain]:
    async with open_chain() as c:
        yield c


def pair_attaches(decoded: Decoded, address: str) -> tuple[Attach, Attach]:
    """The two halves of the (one) pair ``decoded``'s side attached to ``address``: the
    sending half (target ``address``) and the receiving half (source ``address``)."""
    senders = [
        a
        for a in decoded.attaches()
        if a.role is ROLE_SENDER and a.target is not None and a.target.address == address
    ]
    receivers = [
        a
        for a in decoded.attaches()
        if a.role is ROLE_RECEIVER and a.source is not None and a.source.address == address
    ]
    assert len(senders) == 1, senders
    assert len(receivers) == 1, receivers
    return senders[0], receivers[0]


def assert_lp3_pair(sender: Attach, receiver: Attach) -> str:
    """Both halves say paired: true (LP-4), share one name (LP-3), and their own terminus
    addresses mirror each other (LP-7); returns that own address."""
    assert is_paired(sender.properties) and is_paired(receiver.properties)
    assert sender.name == receiver.name
    assert sender.source is not None and receiver.target is not None
    assert sender.source.address == receiver.target.address
    assert sender.source.address is not None
    return str(sender.source.address)


def request_ttl(m: TapMessage) -> int | None:
    header = m.message.header
    return None if header is None else header.ttl


async def retry_until_ok(client: Client, value: Any, within: float = 20.0) -> int:
    """Call echo until it works (the upstream is coming back); returns the failures seen.
    Only what a broken path may answer is retried: its pair detached with detach-forced (the
    contract), or no reply in time. Anything else (the client's own connection lost, another
    condition) fails the test at once, with that error. Between tries it backs off as a
    caller would (the gateway's reconnection is not this test's to watch), a little longer
    each time, so that on a mock clock a long outage costs few jumps."""
    failures = 0
    with trio.fail_after(within):
        while True:
            try:
                got = await client.call(PUBLIC, "echo", value, timeout=5)
            except LinkDetachedError as exc:
                if exc.condition != conditions.DETACH_FORCED:
                    raise
                failures += 1
                await trio.sleep(min(0.05 * failures, 0.5))
                continue
            except TimeoutError:
                failures += 1
                continue
            assert got == value
            return failures


# -- the chain ------------------------------------------------------------------------------


async def test_lp11_three_organisation_chain_forwards_the_bare_message(chain: Chain) -> None:
    values: list[Any] = ["hello", 42, [1, 2.5, None], {"k": ["v", True]}, "é" * 300]
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        for value in values:
            assert await client.call(PUBLIC, "echo", value) == value
        async with trio.open_nursery() as nursery:  # and several in flight at once
            for i in range(20):

                async def one(i: int = i) -> None:
                    assert await client.call(PUBLIC, "echo", f"many-{i}") == f"many-{i}"

                nursery.start_soon(one)
    count = len(values) + 20

    hops = [tap.up() for tap in chain.taps]  # client->GN, GN->GO, GO->CO
    requests = [{m.message_id: m for m in requests_on(h, "echo")} for h in hops]
    assert [len(r) for r in requests] == [count] * 3
    ids = set(requests[0])
    assert set(requests[1]) == ids and set(requests[2]) == ids  # message-id untouched
    for mid in ids:
        at_client, at_gn, at_go = (r[mid] for r in requests)
        # Part 3: the bare message is immutable; a gateway may change the header only
        assert at_gn.bare == at_client.bare
        assert at_go.bare == at_client.bare
        props = at_go.message.properties
        assert props is not None and props.reply_to == wire.ME  # $me keeps its meaning
        ttls = [request_ttl(m) for m in (at_client, at_gn, at_go)]
        assert ttls[0] is not None and ttls[1] is not None and ttls[2] is not None
        assert ttls[0] >= ttls[1] >= ttls[2]  # the deadline only shrinks on the way

    replies = [tap.down().by_correlation_id() for tap in chain.taps]
    for hop in replies:
        assert set(hop) >= ids
    for mid in ids:  # the reply, byte for byte back to the client, correlation-id untouched
        assert replies[0][mid].bare == replies[1][mid].bare == replies[2][mid].bare

    # LP-11: each hop is a pair of its own (new name, own addresses) to the next address
    client_sender, client_receiver = pair_attaches(hops[0], PUBLIC)
    gn_sender, gn_receiver = pair_attaches(hops[1], PUBLIC)
    go_sender, go_receiver = pair_attaches(hops[2], INTERNAL)
    halves = [(client_sender, client_receiver), (gn_sender, gn_receiver), (go_sender, go_receiver)]
    own = [assert_lp3_pair(sender, receiver) for sender, receiver in halves]
    names = [client_sender.name, gn_sender.name, go_sender.name]
    assert len(set(names)) == 3
    assert len(set(own)) == 3
    assert CLIENT_ID in client_sender.name


async def test_lp11_no_internal_or_client_address_crosses_a_gateway(chain: Chain) -> None:
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        for i in range(10):
            assert await client.call(PUBLIC, "echo", i) == i
        with pytest.raises(LinkDetachedError):  # a refusal's words stay inside too
            await client.call(GHOST, "echo", 0)
    internal = INTERNAL.encode()
    ghost = GHOST_INTERNAL.encode()
    mine = CLIENT_ID.encode()
    # the taps see what they should (else the checks below would prove nothing)
    assert mine in chain.client_gn.up_bytes()
    assert internal in chain.go_co.up_bytes() and ghost in chain.go_co.up_bytes()
    # org N's side of GO: neither S nor the client's own names
    for data in (chain.client_gn.all_bytes(), chain.gn_go.all_bytes()):
        assert internal not in data
        assert ghost not in data
    for data in (chain.gn_go.all_bytes(), chain.go_co.all_bytes()):
        assert mine not in data
    # nor anything else of the client's link names and addresses
    client_names = {a.name for a in chain.client_gn.up().attaches()}
    client_addresses = {
        str(t.address)
        for a in chain.client_gn.up().attaches()
        for t in (a.source, a.target)
        if t is not None and t.address is not None and t.address not in (PUBLIC, GHOST)
    }
    assert client_names and client_addresses
    for word in client_names | client_addresses:
        assert word.encode() not in chain.gn_go.all_bytes()


async def test_lp11_proton_client_pairs_by_hand_through_the_chain(chain: Chain) -> None:
    count = 30
    messages = [
        ProtonMessage(
            id=f"req-{i}",
            reply_to=wire.ME,
            body=[f"hello {i}"],
            properties={wire.OPERATION: "echo"},
        )
        for i in range(count)
    ]
    result = await trio.to_thread.run_sync(
        functools.partial(
            run_client,
            chain.client_gn.url,
            send_to=PUBLIC,
            receive_from=PUBLIC,
            link_name="proton-pair-name",
            link_properties={"paired": True},
            messages=messages,
            expect=count,
            user=APPS_USER,
            password=APPS_PASSWORD,
            container_id="proton-secret-abc",
            timeout=15,
        )
    )
    assert result.error is None
    assert "LINK_PAIR_V1_0" in result.remote_offered_capabilities
    assert result.outcomes == ["accepted"] * count  # Proton sends unsettled: settled end to end
    by_id = {str(m.correlation_id): m for m in result.received}
    assert sorted(by_id) == sorted(f"req-{i}" for i in range(count))
    for i in range(count):
        reply = by_id[f"req-{i}"]
        props: Any = reply.properties
        assert props[wire.STATUS_CODE] == 200
        assert reply.body == f"hello {i}"
        assert reply.address == wire.ME
    gn_go = chain.gn_go.all_bytes()
    assert b"proton-secret-abc" not in gn_go
    assert b"proton-pair-name" not in gn_go
    assert INTERNAL.encode() not in chain.client_gn.all_bytes()


# -- refusals -------------------------------------------------------------------------------


async def test_lp11_unknown_public_address_is_not_found(chain: Chain) -> None:
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
            await client.call("nowhere", "echo", 1)
        assert caught.value.condition == conditions.NOT_FOUND
        assert await client.call(PUBLIC, "echo", 2) == 2  # the connection is fine
    # GN answered both halves with a null terminus (§2.6.3: the link was never created) ...
    asked = {a.name for a in chain.client_gn.up().attaches() if "nowhere" in repr(a)}
    answers = [a for a in chain.client_gn.down().attaches() if a.name in asked]
    assert len(answers) == 2, answers
    for a in answers:
        assert (a.target if a.role is ROLE_RECEIVER else a.source) is None, a
    detaches = chain.client_gn.down().of(Detach)
    assert any(
        d.error is not None and d.error.condition == conditions.NOT_FOUND for d in detaches
    )  # ... then the detach that says why
    assert b"nowhere" not in chain.gn_go.all_bytes()  # nothing went upstream


async def test_lp11_user_not_allowed_on_the_route_is_unauthorized(chain: Chain) -> None:
    async with connect(chain.url_as(GUEST_USER, GUEST_PASSWORD), container_id=CLIENT_ID) as guest:
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
            await guest.call(PUBLIC, "echo", 1)
    assert caught.value.condition == conditions.UNAUTHORIZED_ACCESS
    assert CLIENT_ID.encode() not in chain.gn_go.all_bytes()
    assert not requests_on(chain.gn_go.up(), "echo")


async def test_health_tells_a_user_only_of_the_routes_it_may_use(chain: Chain) -> None:
    """A route a user may not use is, to that user's health checks, a route that does not
    exist: a 404 like an unknown name, not its state (issue 22)."""
    async with connect(chain.url_as(GUEST_USER, GUEST_PASSWORD)) as guest:
        with trio.fail_after(10), pytest.raises(RemoteError) as denied:
            await guest.call("$health", "check", service=PUBLIC)
        with trio.fail_after(10), pytest.raises(RemoteError) as unknown:
            await guest.call("$health", "check", service="no-such-route")
        assert await guest.call("$health", "check") == {"status": "serving"}
    assert (denied.value.status, unknown.value.status) == (404, 404)
    assert denied.value.message == f"no route at the address {PUBLIC!r}"
    async with connect(chain.url_as(APPS_USER, APPS_PASSWORD)) as apps:
        with trio.fail_after(10):
            assert await apps.call("$health", "check", service=PUBLIC) == {"status": "serving"}


async def test_lp11_bad_inbound_password_is_refused_at_sasl(
    chain: Chain, io_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10), pytest.raises(AuthenticationError):
        async with connect(chain.url_as(APPS_USER, "wrong-" + APPS_PASSWORD)):
            pass
    with trio.fail_after(10), pytest.raises(AuthenticationError):
        async with connect(chain.url_as("org-x-stranger", APPS_PASSWORD)):
            pass
    assert not chain.gn_go.connections or not chain.gn_go.up().attaches()


async def test_lp11_upstream_refusal_reaches_the_client(chain: Chain) -> None:
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
            await client.call(GHOST, "echo", 1)
        assert caught.value.condition == conditions.NOT_FOUND
        assert await client.call(PUBLIC, "echo", 2) == 2
    # it really was CO that said no, to GO's pair for the internal address
    co_detaches = chain.go_co.down().of(Detach)
    assert any(
        d.error is not None and d.error.condition == conditions.NOT_FOUND for d in co_detaches
    )
    assert GHOST_INTERNAL.encode() in chain.go_co.up_bytes()
    # and GO passed it on as the same condition, to GN, which passed it to the client
    for tap in (chain.gn_go, chain.client_gn):
        assert any(
            d.error is not None and d.error.condition == conditions.NOT_FOUND
            for d in tap.down().of(Detach)
        ), tap


async def test_lp11_non_paired_attach_is_not_implemented(chain: Chain) -> None:
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        sender = open_sender(conn, PUBLIC, name="plain-sender", source_address="plain-here")
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as caught:
            await sender.take_credit()  # no credit ever comes; the link's end wakes us
        assert caught.value.condition == conditions.NOT_IMPLEMENTED
    assert b"plain-sender" not in chain.gn_go.all_bytes()


# -- LP-9: the routing node -------------------------------------------------------------------


async def test_lp9_routing_node_routes_each_message_by_its_to(chain: Chain) -> None:
    chain.slow.gate.set()  # the slow service answers at once here
    name, here = "anonymous-pair", "anonymous-here"
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        sender = open_sender(
            conn, None, name=name, source_address=here, properties=paired_properties()
        )
        receiver = open_receiver(
            conn, None, name=name, target_address=here, properties=paired_properties(), credit=100
        )
        sent: dict[str, str] = {}
        with trio.fail_after(10):
            for i in range(12):
                to, operation = (PUBLIC, "echo") if i % 2 else (SLOW, "hold")
                sent[f"routed-{i}"] = to
                await sender.send(routed_request(i, to, operation), settled=True)
            got: dict[str, Any] = {}
            while len(got) < len(sent):
                item = await receiver.receive()
                receiver.settle(item, Accepted())
                props = item.message.properties
                assert props is not None
                got[str(props.correlation_id)] = wire.parse_reply(item.message)
        assert got == {mid: f"routed-{mid.split('-')[1]}" for mid in sent}

        # an unroutable `to`, unsettled: rejected, not-found; the link stays up
        with trio.fail_after(10):
            delivery = await sender.send(routed_request(99, "nowhere"), settled=False)
        state = delivery.remote_state
        assert isinstance(state, Rejected)
        assert state.error is not None and state.error.condition == conditions.NOT_FOUND
        with trio.fail_after(10):
            await sender.send(routed_request(100, PUBLIC), settled=True)
            item = await receiver.receive()
        assert wire.parse_reply(item.message) == "routed-100"
    # upstream, one pair per address, to the public addresses of GO only
    upstream = chain.gn_go.up()
    for address in (PUBLIC, SLOW):
        assert_lp3_pair(*pair_attaches(upstream, address))
    assert b"nowhere" not in chain.gn_go.all_bytes()
    internal = chain.go_co.up()
    assert_lp3_pair(*pair_attaches(internal, INTERNAL))
    assert_lp3_pair(*pair_attaches(internal, SLOW_INTERNAL))
    for word in (name, here, CLIENT_ID):
        assert word.encode() not in chain.gn_go.all_bytes()


async def test_lp9_unroutable_to_is_rejected_with_not_found(chain: Chain) -> None:
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        sender = open_sender(
            conn, None, name="anon", source_address="anon-here", properties=paired_properties()
        )
        open_receiver(
            conn, None, name="anon", target_address="anon-here", properties=paired_properties()
        )
        with trio.fail_after(10):
            missing = await sender.send(routed_request(1, "nowhere"), settled=False)
            no_to = await sender.send(routed_request(2, None), settled=False)
        for delivery in (missing, no_to):
            state = delivery.remote_state
            assert isinstance(state, Rejected), state
            assert state.error is not None
        assert isinstance(missing.remote_state, Rejected)
        assert missing.remote_state.error is not None
        assert missing.remote_state.error.condition == conditions.NOT_FOUND
    assert not chain.gn_go.up().messages  # nothing went anywhere


async def test_lp9_unroutable_presettled_message_detaches_the_node_with_not_found(
    chain: Chain,
) -> None:
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        sender = open_sender(
            conn, None, name="anon", source_address="anon-here", properties=paired_properties()
        )
        open_receiver(
            conn, None, name="anon", target_address="anon-here", properties=paired_properties()
        )
        with trio.fail_after(10):
            await sender.send(routed_request(1, "nowhere"), settled=True)  # cannot be rejected
            await wait_until(lambda: sender.detached is not None)
        assert sender.detached is not None
        assert sender.detached.condition == conditions.NOT_FOUND


# -- settlement and detach, end to end ----------------------------------------------------------


async def test_lp11_outcomes_flow_end_to_end(chain: Chain) -> None:
    """Unsettled requests are settled downstream with the outcome CO gave, never before."""
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        name = "outcome-pair"
        sender = open_sender(
            conn, PUBLIC, name=name, source_address=name, properties=paired_properties()
        )
        receiver = open_receiver(
            conn, PUBLIC, name=name, target_address=name, properties=paired_properties()
        )
        good = routed_request(1, None)
        bad = routed_request(2, None)
        assert bad.properties is not None
        bad.properties.reply_to = "no-such-reply-node"  # CO has no link to send it on
        with trio.fail_after(10):
            accepted = await sender.send(good, settled=False)
            rejected = await sender.send(bad, settled=False)
            reply = await receiver.receive()
        assert isinstance(accepted.remote_state, Accepted)
        assert wire.parse_reply(reply.message) == "routed-1"
        state = rejected.remote_state
        assert isinstance(state, Rejected) and state.error is not None
        assert state.error.condition == conditions.NOT_FOUND  # CO's verdict, passed back twice
    # each hop settled each request exactly once, with the outcome from upstream
    for tap in chain.taps:
        outcomes = [type(d.state).__name__ for d in tap.down().of(Disposition) if d.state]
        assert sorted(outcomes) == ["Accepted", "Rejected"], (tap, outcomes)
    async with connect(chain.url, container_id=CLIENT_ID, settled=False) as client:
        for i in range(10):  # our client in unsettled mode checks every outcome
            assert await client.call(PUBLIC, "echo", i) == i


async def paired_round_trip(conn: AmqpConnection, name: str) -> tuple[Sender, Receiver]:
    """Attach a pair by hand to the public address and make one call on it."""
    sender = open_sender(
        conn, PUBLIC, name=name, source_address=name, properties=paired_properties()
    )
    receiver = open_receiver(
        conn, PUBLIC, name=name, target_address=name, properties=paired_properties()
    )
    with trio.fail_after(10):
        await sender.send(routed_request(1, None), settled=True)
        assert wire.parse_reply((await receiver.receive()).message) == "routed-1"
    return sender, receiver


async def test_lp11_detach_propagates_upstream_with_its_error(chain: Chain) -> None:
    gone = Error(condition="com.example:client-gone", description="the caller went away")
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        sender, receiver = await paired_round_trip(conn, "closing-pair")
        sender.detach(gone)
        receiver.detach(gone)
        with trio.fail_after(10):
            for tap, address in ((chain.gn_go, PUBLIC), (chain.go_co, INTERNAL)):
                handles = {a.handle for a in pair_attaches(tap.up(), address)}

                def detached(tap: ByteTap = tap, handles: set[int] = handles) -> bool:
                    return {d.handle for d in tap.up().of(Detach) if d.closed} >= handles

                await wait_until(detached)
                errors = [d.error for d in tap.up().of(Detach) if d.handle in handles]
                assert [e.condition if e else None for e in errors] == [gone.condition] * 2, tap
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        assert await client.call(PUBLIC, "echo", 2) == 2  # new pairs, end to end


async def test_lp11_a_close_with_an_error_propagates_upstream_as_the_pairs_detach(
    chain: Chain,
) -> None:
    closing = Error(condition="amqp:connection:forced", description="client shutting down")
    async with net.connect(chain.url, container_id=CLIENT_ID) as conn:
        await paired_round_trip(conn, "closed-with-error")
        await conn.close(closing)
    with trio.fail_after(10):
        handles = {a.handle for a in pair_attaches(chain.gn_go.up(), PUBLIC)}

        def detached() -> bool:
            return {d.handle for d in chain.gn_go.up().of(Detach) if d.closed} >= handles

        await wait_until(detached)
    errors = [d.error for d in chain.gn_go.up().of(Detach) if d.handle in handles]
    assert [e.condition if e else None for e in errors] == [closing.condition] * 2


# -- credit end to end ------------------------------------------------------------------------


async def test_lp11_credit_end_to_end_a_slow_service_slows_the_client(chain: Chain) -> None:
    calls = 8
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            results[i] = await client.call(SLOW, "hold", i)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(one, i)
                # CO holds its mailbox's worth of calls...
                await wait_until(lambda: len(requests_on(chain.go_co.up(), "hold")) >= SLOW_MAILBOX)
                await wait_until(lambda: chain.slow.started >= 1)
                # ... and whatever else was going to move has moved: every peer of the chain
                # runs in this process, so all its tasks waiting is no byte on its way
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                held = [len(requests_on(tap.up(), "hold")) for tap in chain.taps]
                # no hop took more than CO granted: the other calls wait in the client, as the
                # credit granted on each hop's request link says (the client's: GN's grants)
                assert held == [SLOW_MAILBOX] * 3, held
                for tap in (chain.client_gn, chain.gn_go):
                    grants = request_link_grants(tap.down(), tap.up(), SLOW)
                    assert grants and max(grants) <= SLOW_MAILBOX, (tap, grants)
                chain.slow.gate.set()
    assert results == {i: i for i in range(calls)}
    for tap in (chain.client_gn, chain.gn_go):  # never more, until the end
        assert max(request_link_grants(tap.down(), tap.up(), SLOW)) <= SLOW_MAILBOX, tap
    assert [len(requests_on(tap.up(), "hold")) for tap in chain.taps] == [calls] * 3


def request_link_grants(down: Decoded, up: Decoded, address: str) -> list[int]:
    """Every link-credit the answering side granted on the request half of the pair the
    connecting side attached to ``address`` (its flows on the handle of its answer)."""
    sender, _ = pair_attaches(up, address)
    grants: list[int] = []
    handle = None
    for f in down.frames:
        if isinstance(f, Attach) and f.name == sender.name and f.role is ROLE_RECEIVER:
            handle = f.handle
        elif isinstance(f, Flow) and f.handle == handle and f.link_credit is not None:
            grants.append(f.link_credit)
    return grants


# -- faults ----------------------------------------------------------------------------------


class CoProcess:
    """CO as a process (``pairlink serve``), killable, restartable on its port."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.process: trio.Process | None = None

    async def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "pairlink",
            "serve",
            "services.echo",
            "--listen",
            f"amqp://{LOOPBACK}:{self.port}",
            "--address",
            INTERNAL,
        ]
        with self.log.open("ab") as out:
            self.process = await trio.lowlevel.open_process(
                argv, cwd=REPO, stdout=out, stderr=out, env={**os.environ, "PYTHONPATH": str(REPO)}
            )
        with trio.fail_after(15):
            while True:
                assert self.process.returncode is None, self.log.read_text()
                try:
                    stream = await trio.open_tcp_stream(LOOPBACK, self.port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                return

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        with trio.move_on_after(5, shield=True) as scope:
            await process.wait()
        if scope.cancelled_caught:
            process.kill()
            with trio.move_on_after(5, shield=True):
                await process.wait()


IDLE = 3.0


async def test_lp11_co_killed_mid_call_fails_the_call_then_recovers(tmp_path: Path) -> None:
    co = CoProcess(free_port(), tmp_path / "co.log")
    await co.start()
    try:
        async with (
            open_chain(co_port=co.port, idle_timeout=IDLE) as chain,
            connect(chain.url, container_id=CLIENT_ID) as client,
        ):
            assert await client.call(PUBLIC, "echo", "before") == "before"
            failed: list[BaseException] = []

            async def sleeper() -> None:
                try:
                    await client.call(PUBLIC, "sleep", 60, timeout=60)
                except PairlinkError as exc:
                    failed.append(exc)

            with trio.fail_after(IDLE + 5):  # within the idle timeout, and then some
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sleeper)
                    await wait_until(lambda: bool(requests_on(chain.go_co.up(), "sleep")))
                    await co.kill()
            [error] = failed
            assert isinstance(error, LinkDetachedError | ConnectionLostError), error
            assert error.condition == conditions.DETACH_FORCED, error

            # while CO is away, calls fail (fast: well before their own timeout)
            with trio.fail_after(5), pytest.raises(LinkDetachedError) as caught:
                await client.call(PUBLIC, "echo", "while-down", timeout=30)
            assert caught.value.condition == conditions.DETACH_FORCED

            await co.start()  # back, on the same port
            await retry_until_ok(client, "after")
            for i in range(5):
                assert await client.call(PUBLIC, "echo", i) == i
            assert len(chain.go_co.connections) >= 2  # GO's upstream reconnected
    finally:
        await co.stop()


async def test_lp11_go_restarted_gn_reconnects(chain: Chain) -> None:
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        assert await client.call(PUBLIC, "echo", "before") == "before"
        first = chain.gn_go.connections[0]
        await chain.go.stop()
        with trio.fail_after(5), pytest.raises(LinkDetachedError) as caught:
            await client.call(PUBLIC, "echo", "while-down", timeout=30)
        assert caught.value.condition == conditions.DETACH_FORCED
        await chain.go.start(chain.nursery)
        await retry_until_ok(client, "after")
        assert len(chain.gn_go.connections) >= 2
        assert first.ended.is_set()
        # the new upstream connection carried the call that worked
        last = chain.gn_go.connections[-1]
        assert requests_on(decode_stream(bytes(last.up)), "echo")
        assert b"after" in last.up


async def test_lp11_upstream_connection_cut_gn_reconnects(
    chain: Chain, io_clock: trio.testing.MockClock
) -> None:
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        assert await client.call(PUBLIC, "echo", "before") == "before"
        failed: list[BaseException] = []

        async def sleeper() -> None:
            try:
                await client.call(PUBLIC, "sleep", 60, timeout=60)
            except PairlinkError as exc:
                failed.append(exc)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sleeper)
                await wait_until(lambda: bool(requests_on(chain.go_co.up(), "sleep")))
                chain.gn_go.cut()
        [error] = failed
        assert isinstance(error, LinkDetachedError), error
        assert error.condition == conditions.DETACH_FORCED
        await retry_until_ok(client, "after")
        assert len(chain.gn_go.connections) >= 2


async def test_lp11_silent_upstream_fails_calls_within_the_idle_timeout(
    io_clock: trio.testing.MockClock,
) -> None:
    idle = 1.5
    async with (
        open_chain(idle_timeout=idle) as chain,
        connect(chain.url, container_id=CLIENT_ID) as client,
    ):
        assert await client.call(PUBLIC, "echo", "before") == "before"
        failed: list[BaseException] = []

        async def sleeper() -> None:
            try:
                await client.call(PUBLIC, "sleep", 60, timeout=60)
            except PairlinkError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper)
            await wait_until(lambda: bool(requests_on(chain.go_co.up(), "sleep")))
            chain.gn_go.freeze()  # GO goes silent for GN: no bytes, no close, no reset
            frozen_at = trio.current_time()
        assert trio.current_time() - frozen_at <= idle  # its last frame came before the freeze
        [error] = failed
        assert isinstance(error, LinkDetachedError), error
        assert error.condition == conditions.DETACH_FORCED
        await retry_until_ok(client, "after")  # over a new connection (the tap lets it pass)
        chain.gn_go.thaw()


# -- load ------------------------------------------------------------------------------------


async def test_lp11_load_20_clients_500_calls_each_every_reply_exactly_once(chain: Chain) -> None:
    clients, calls, in_flight = 20, 500, 25
    seen: Counter[str] = Counter()
    late = 0

    async def run_client_load(c: int) -> None:
        nonlocal late
        async with connect(chain.url, container_id=f"load-{c}") as client:

            async def worker(w: int) -> None:
                for i in range(w, calls, in_flight):
                    value = f"{c}:{i}"
                    got = await client.call(PUBLIC, "echo", value)
                    assert got == value
                    seen[got] += 1

            async with trio.open_nursery() as nursery:
                for w in range(in_flight):
                    nursery.start_soon(worker, w)
            late += client.late_replies

    with trio.fail_after(45):
        async with trio.open_nursery() as nursery:
            for c in range(clients):
                nursery.start_soon(run_client_load, c)
    assert late == 0
    assert len(seen) == clients * calls
    assert set(seen.values()) == {1}
    # on the wire at the client's edge: each reply once, to its own pair
    replies = Counter(
        (m.link, m.correlation_id) for m in chain.client_gn.down().messages if m.correlation_id
    )
    assert len(replies) == clients * calls
    assert set(replies.values()) == {1}
    # upstream, each client's pair on a connection of its own (its lane), beside the
    # gateway's main connection, which carries none
    for tap in (chain.gn_go, chain.go_co):
        assert len(tap.connections) == 1 + clients, tap
        carried = [names_in(decode_stream(bytes(c.up)).frames) for c in tap.connections]
        # (a lane may carry a second pair: a pipelined first call that found no room is
        # detached, LP-10, and the client pairs again)
        main, *lanes = sorted(carried, key=len)
        assert not main and all(lanes), carried


# -- the harness itself ---------------------------------------------------------------------


async def test_tap_records_and_decodes_a_direct_call() -> None:
    """The tap, without gateways (client -> tap -> CO): what the checks above rely on."""
    async with trio.open_nursery() as nursery:
        async with open_server(
            hosted(Echo, address=INTERNAL), listen=f"amqp://{LOOPBACK}:0", grace=1
        ) as server:
            tap: ByteTap = await nursery.start(ByteTap("direct", server.port).run)
            async with connect(tap.url, container_id=CLIENT_ID) as client:
                for i in range(3):
                    assert await client.call(INTERNAL, "echo", i) == i
                requests = requests_on(tap.up(), "echo")
                replies = tap.down().by_correlation_id()
                assert [m.message_id for m in requests] == [1, 2, 3]
                assert [wire.parse_reply(replies[i].message) for i in (1, 2, 3)] == [0, 1, 2]
                sender, receiver = pair_attaches(tap.up(), INTERNAL)
                assert assert_lp3_pair(sender, receiver).startswith(f"pair-{CLIENT_ID}-")
                for m in requests:
                    assert m.payload.endswith(m.bare) and m.bare != m.payload  # a header first
                tap.cut()
                with trio.fail_after(5), pytest.raises(ConnectionLostError):
                    await client.call(INTERNAL, "echo", 4)
        nursery.cancel_scope.cancel()
