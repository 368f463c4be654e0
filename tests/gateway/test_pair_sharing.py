"""Issue 22: a gateway's callers share what lies behind it, as a service's own callers do.

Before, every caller of a gateway reached the next hop on the gateway's one connection: there,
one client's hundreds of pairs were queued ahead of another's (each attach held that connection's
input for up to CREDIT_WAIT at the next gateway) and held all the credit of the service's
mailbox, which it shares per connection. Each inbound connection now has upstream connections of
its own (a lane). All through the real chain over TCP on 127.0.0.1.
"""

from __future__ import annotations

import pytest
import trio

from pairlink import connect, hosted, open_server
from pairlink._amqp import errors as conditions
from pairlink._io import net
from pairlink.gateway import open_gateway, parse_config
from services.echo import Echo
from tests.gateway.chain import (
    INTERNAL,
    LOOPBACK,
    PUBLIC,
    attach_pair,
    decode_stream,
    echo_on,
    names_in,
    open_chain,
    wait_until,
)
from tests.gateway.test_capacity import attached, open_pairs, refused

MAILBOX = 64
"""The echo's mailbox behind the chain: the credit every caller through it shares."""
BACKLOG = 200
"""Pairs client A opens at once: more than the echo has credit for, so that most wait."""


@pytest.mark.usefixtures("io_clock")  # what waits for credit waits in virtual time
async def test_one_clients_backlog_of_pairs_never_delays_another_clients_call() -> None:
    """A (one connection) opens BACKLOG pairs and sends nothing on them; once they hold all
    of the echo's credit, B (another connection of the same user) calls. B's reply comes while
    A's backlog still waits for credit: before, B's pair waited behind A's at GO (the attaches
    on GN's one connection to it, each held up to CREDIT_WAIT) and at the echo (links of one
    caller there, all its credit A's), and the call never came back."""
    async with (
        open_chain(echo_mailbox=MAILBOX, idle_timeout=3600) as chain,
        net.connect(chain.url) as a,
    ):
        backlog = open_pairs(a, BACKLOG, "a")
        # A's pairs hold all the echo's credit: those after wait for credit at each hop
        await backlog[MAILBOX][0].attached.wait()
        async with connect(chain.url) as b:
            assert await b.call(PUBLIC, "echo", "b", timeout=60) == "b"
        waiting = [sender for sender, _ in backlog if not sender.has_credit()]
        assert len(waiting) >= BACKLOG - MAILBOX
        # CO saw B's pair on a connection of its own, not on A's
        assert len(chain.go_co.connections) == 3  # GO's main one, A's lane, B's lane
        main, lane_a, lane_b = (decode_stream(bytes(c.up)) for c in chain.go_co.connections)
        assert not names_in(main.frames)
        assert len(names_in(lane_a.frames)) > MAILBOX
        assert len(names_in(lane_b.frames)) == 1


@pytest.mark.usefixtures("io_clock")
async def test_pairs_past_the_next_hops_credit_are_answered_without_holding_the_caller() -> None:
    """A opens BACKLOG pairs, more than the echo has credit for: GN and GO answer each as
    soon as the echo answers it (the echo grants with its attach answer, as their first pairs
    showed, so a pair answered without credit has none coming soon), A's input is never held
    for long, and A stays connected (before, each pair past the credit waited CREDIT_WAIT at
    each gateway, and GN's 5 s idle timeout closed A, its heartbeats unread). A pair answered
    without credit gets it once A's other pairs give theirs back."""
    async with open_chain(echo_mailbox=MAILBOX) as chain, net.connect(chain.url) as a:
        backlog = open_pairs(a, BACKLOG, "a")
        with trio.fail_after(60):  # virtual seconds (before: 2 s a pair past the credit)
            for sender, receiver in backlog:
                await sender.attached.wait()
                await receiver.attached.wait()
        assert not a.closed.is_set()
        late = backlog[MAILBOX]
        assert not late[0].has_credit()
        for sender, receiver in backlog[:10]:
            sender.detach()
            receiver.detach()
        with trio.fail_after(10):
            assert await echo_on(*late, "late") == "late"


GATEWAY_TOML = """\
listen = "amqp://127.0.0.1:0"
[users]
alice = {{ password_env = "ALICE_PASSWORD", max_pairs = 2 }}
bob = {{ password_env = "BOB_PASSWORD" }}
[[route]]
public = "billing"
upstream = "{upstream}"
address = "{address}"
"""


async def test_a_user_with_a_smaller_share_is_refused_at_it_and_another_user_is_not() -> None:
    """``[users] alice = { ..., max_pairs = 2 }``: alice's third pair is refused with
    resource-limit-exceeded, naming her share; bob (the default share, half of max_pairs)
    opens three, and each carries a call."""
    environ = {"ALICE_PASSWORD": "alice-secret", "BOB_PASSWORD": "bob-secret"}
    async with open_server(
        hosted(Echo, address=INTERNAL), listen=f"amqp://{LOOPBACK}:0", grace=1
    ) as co:
        text = GATEWAY_TOML.format(upstream=co.url, address=INTERNAL)
        config = parse_config(text, environ=environ)
        async with (
            open_gateway(config) as gn,
            net.connect(f"amqp://alice:alice-secret@{LOOPBACK}:{gn.port}") as alice,
            net.connect(f"amqp://bob:bob-secret@{LOOPBACK}:{gn.port}") as bob,
        ):
            await attached([attach_pair(alice, f"alice-{i}") for i in range(2)])
            error = await refused(attach_pair(alice, "alice-2"))
            assert error.condition == conditions.RESOURCE_LIMIT_EXCEEDED
            assert "alice may hold 2 pairs at most" in str(error)
            pairs = [attach_pair(bob, f"bob-{i}") for i in range(3)]
            await attached(pairs)
            with trio.fail_after(10):
                for i, pair in enumerate(pairs):
                    assert await echo_on(*pair, i) == i
            assert gn.pairs.by_user == {"alice": 2, "bob": 3}


async def test_a_callers_upstream_connections_close_when_it_leaves() -> None:
    """Each client's lane closes with the client: after 20 clients came, called and left, GN
    and GO hold their main connection to the next hop and nothing else."""
    clients = 20
    async with open_chain() as chain:
        for i in range(clients):
            async with connect(chain.url) as client:
                assert await client.call(PUBLIC, "echo", i) == i
        gn, go = chain.gn.gateway, chain.go.gateway
        assert gn is not None and go is not None
        for tap in (chain.gn_go, chain.go_co):
            main, *lanes = tap.connections
            assert len(lanes) == clients
            await wait_until(lambda lanes=lanes: all(c.ended.is_set() for c in lanes))
            assert not main.ended.is_set()
        for upstream in (gn.upstreams[PUBLIC].upstreams[0], go.upstreams[PUBLIC].upstreams[0]):
            assert not upstream.lanes
            assert list(upstream.sessions) == [upstream.current]
