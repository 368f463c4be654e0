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

from pairlink import connect
from pairlink._io import net
from tests.gateway.chain import PUBLIC, decode_stream, echo_on, names_in, open_chain
from tests.gateway.test_capacity import open_pairs

MAILBOX = 64
"""The echo's mailbox behind the chain: the credit every caller through it shares."""
BACKLOG = 200
"""Pairs client A opens at once: more than the echo has credit for, so that most wait."""


@pytest.mark.usefixtures("io_clock")  # GN and GO wait CREDIT_WAIT for credit A does not get
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
    """A opens BACKLOG pairs, more than the echo has credit for: GN and GO wait CREDIT_WAIT
    for the first pair that gets none, and answer the rest as soon as the echo answers them,
    so A's input is never held for long and A stays connected (before, each waited a
    CREDIT_WAIT at each gateway, and GN's 5 s idle timeout closed A, its heartbeats unread).
    A pair answered without credit gets it once A's other pairs give theirs back."""
    async with open_chain(echo_mailbox=MAILBOX) as chain, net.connect(chain.url) as a:
        backlog = open_pairs(a, BACKLOG, "a")
        with trio.fail_after(60):  # virtual seconds: one CREDIT_WAIT in all, not one a pair
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
