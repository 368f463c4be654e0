"""The mailbox bound holds, however many links callers open, and callers share it fairly.

Over real TCP against a served service whose handler waits for permits the test hands out (no
timers), callers made of bare engines attach thousands of request links and send one call on
each as soon as it has credit. What the service holds is read on its side (its mailbox, and the
handler's own count of calls running at once); what it promised is read on the wire, from the
caller's side: after every read, the credit the service's flows left a caller plus the calls it
has sent and not had answered never exceed the mailbox.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from pairlink import handler, hosted, open_server, service
from pairlink._amqp import errors
from pairlink._amqp.events import LinkFlow, MessageReceived
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Message, Source, Target
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER, Attach, Detach, Flow
from pairlink._amqp.session import SessionState
from pairlink._rpc import wire
from pairlink._server.actor import Actor
from pairlink._server.mailbox import RESERVE_DIVISOR, CreditedLink
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, wait_for

MAILBOX = 16  # below RESERVE_DIVISOR: no reserve, "room" is exactly the free slots
LINKS = 2_048
PER_SESSION = 1_000  # within the session's handle-max (1,023)


@service("gate", mailbox=MAILBOX, max_concurrency=MAILBOX)
class Gate:
    """``hold`` runs until the test hands it a permit; ``ping`` answers at once. Every held call
    runs (max_concurrency = mailbox), so ``running`` counts the calls the service holds."""

    def __init__(self) -> None:
        self.permits = trio.Semaphore(0)
        self.running = 0
        self.most = 0  # the most holds running at once
        self.pings = 0
        self.order: list[object] = []  # the calls, as they started

    @handler
    async def hold(self, i: int) -> int:
        self.order.append(i)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.permits.acquire()
        finally:
            self.running -= 1
        return i

    @handler
    def ping(self) -> str:
        self.order.append("ping")
        self.pings += 1
        return "pong"


@pytest.fixture
async def gate() -> Gate:
    return Gate()


@pytest.fixture
async def server(gate: Gate) -> AsyncIterator[Server]:
    async with open_server(gate, listen="amqp://127.0.0.1:0", grace=0.5) as s:
        yield s
        for _ in range(LINKS):  # whatever still waits for a permit may finish
            gate.permits.release()


@pytest.fixture
def actor(server: Server) -> Actor:
    return server.actors["gate"]


class Swarm:
    """One connection with ``n`` request links to ``address`` (classic, not paired: one reply
    link serves them all) spread over sessions of ``PER_SESSION`` links; it sends one call on
    each link as soon as that link has credit, and gives back credit it is asked to drain.
    ``check`` runs after every read, with the swarm's view of the wire."""

    def __init__(self, raw: RawClient, address: str, n: int, name: str) -> None:
        self.raw = raw
        self.address = address
        self.name = name
        self.n = n
        self.links: list[Link] = []
        self.unsent: set[Link] = set()
        self.credited: set[Link] = set()  # links the service's flows left some credit
        self.sent = 0
        self.answered = 0
        self.check: Callable[[], None] = lambda: None
        self._seen = 0  # events of the engine already looked at

    async def attach(self) -> None:
        raw = self.raw
        self.replies = raw.attach(
            f"{self.name}-replies", ROLE_RECEIVER, source=self.address, target=self.name
        )
        raw.engine.flow(self.replies, self.n)  # reply credit for every call it will make
        session = raw.session
        for i in range(self.n):
            if i and i % PER_SESSION == 0:
                session = raw.engine.begin()
                await raw.read_until(lambda s=session: s.state is SessionState.MAPPED)  # type: ignore[misc]
            link = raw.engine.attach(
                session,
                name=f"{self.name}-{i}",
                role=ROLE_SENDER,
                source=Source(address=self.name),
                target=Target(address=self.address),
            )
            self.links.append(link)
        self.unsent = set(self.links)
        await raw.read_until(lambda: all(link.remote_attach for link in self.links), within=30)
        self.react()

    @property
    def credit(self) -> int:
        """The credit the service's flows have left this connection, unused."""
        return sum(link.link_credit for link in self.credited)

    @property
    def in_flight(self) -> int:
        return self.sent - self.answered

    def react(self) -> bool:
        """Send on links that got credit, answer drains; True if there is something to send."""
        events = self.raw.events[self._seen :]
        self._seen = len(self.raw.events)
        acted = False
        for event in events:
            if isinstance(event, MessageReceived) and event.link is self.replies:
                self.answered += 1
                assert isinstance(wire.parse_reply(Message.decode(event.payload)), int)
            elif isinstance(event, LinkFlow) and event.link.is_sender:
                link = event.link
                if link in self.unsent and link.link_credit > 0:
                    self.unsent.discard(link)
                    self.raw.request(link, "hold", self.sent, reply_to=self.name)
                    self.sent += 1
                    acted = True
                if link.drain and link.link_credit > 0:  # nothing (more) to send: give it back
                    self.raw.engine.complete_drain(link)
                    acted = True
                if link.link_credit > 0:
                    self.credited.add(link)
                else:
                    self.credited.discard(link)
        self.check()
        return acted

    async def pump(self) -> None:
        """Read and react, until cancelled."""
        while True:
            await self.raw.read_until(self.react, within=math.inf)


def never_over(bound: int, *swarms: Swarm) -> Callable[[], None]:
    """A check for the swarms: what the service promised them on the wire (credit left plus
    calls sent and not answered) is never more than ``bound``."""

    def check() -> None:
        promised = sum(s.credit + s.in_flight for s in swarms)
        assert promised <= bound, [(s.name, s.credit, s.in_flight) for s in swarms]

    return check


def server_link(actor: Actor, name: str) -> CreditedLink:
    (origin,) = [o for o in actor.links if o.link.name == name]
    return origin


async def test_two_thousand_links_on_two_connections_never_hold_more_than_the_mailbox(
    server: Server, gate: Gate, actor: Actor
) -> None:
    async with raw_client(server.url) as raw_a, raw_client(server.url) as raw_b:
        a = Swarm(raw_a, "gate", LINKS // 2, "a")
        b = Swarm(raw_b, "gate", LINKS // 2, "b")
        a.check = b.check = never_over(MAILBOX, a, b)
        await a.attach()
        await b.attach()
        assert len(actor.links) == LINKS
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.pump)
            nursery.start_soon(b.pump)
            # the mailbox fills up; every other link waits with no credit at all
            await wait_for(lambda: gate.running == MAILBOX and a.sent + b.sent == MAILBOX)
            assert actor.held == MAILBOX and actor.outstanding == 0
            assert a.credit == b.credit == 0
            assert len(a.unsent) + len(b.unsent) == LINKS - MAILBOX
            # every call gets its turn, the bound holding all the way
            for _ in range(LINKS):
                gate.permits.release()
            await wait_for(lambda: a.answered + b.answered == LINKS, within=50)
            nursery.cancel_scope.cancel()
    assert gate.most == MAILBOX and actor.peak == MAILBOX  # full, and never more


async def test_a_new_caller_is_admitted_as_soon_as_a_slot_frees_ahead_of_thousands_waiting(
    server: Server, gate: Gate, actor: Actor
) -> None:
    async with raw_client(server.url) as raw_a, raw_client(server.url) as newcomer:
        a = Swarm(raw_a, "gate", LINKS, "a")
        a.check = never_over(MAILBOX, a)
        await a.attach()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.pump)
            await wait_for(lambda: gate.running == MAILBOX and a.sent == MAILBOX)
            sender, _ = newcomer.pair("gate", "late")
            await newcomer.wait_attached(sender)
            assert sender.link_credit == 0  # the mailbox is full: a link may get no credit
            late = server_link(actor, "late")
            assert late.ledger.granted == 0 and actor.held == MAILBOX
            gate.permits.release()  # one of a's calls ends: its slot is the newcomer's
            await newcomer.read_until(lambda: sender.link_credit > 0)
            mid, _ = newcomer.request(sender, "ping")
            assert wire.parse_reply(await newcomer.wait_reply(mid)) == "pong"
            # a has thousands of links still waiting, none of which got that slot
            assert len(a.unsent) == LINKS - MAILBOX
            assert all(o.ledger.granted == 0 for o in actor.links if o is not late)
            assert gate.pings == 1 and actor.peak == MAILBOX
            # holding a call now, the newcomer is still below its share (half the mailbox),
            # a far above it: the next freed slot is the newcomer's again
            await newcomer.read_until(lambda: sender.link_credit > 0)
            newcomer.request(sender, "hold", -1)
            await newcomer.flush()
            await wait_for(lambda: actor.held == MAILBOX and late.ledger.granted == 0)
            gate.permits.release()
            await newcomer.read_until(lambda: sender.link_credit > 0)
            assert all(o.ledger.granted == 0 for o in actor.links if o is not late)
            assert len(a.unsent) == LINKS - MAILBOX and actor.peak == MAILBOX
            nursery.cancel_scope.cancel()


async def test_credit_taken_back_by_drain_still_answers_what_was_on_its_way(
    server: Server, gate: Gate, actor: Actor
) -> None:
    """A caller alone gets the whole mailbox as credit on its first link. A second caller
    comes: the first is asked to drain (never lowered: a request it sent meanwhile is still
    taken and answered, not refused), and once it gives the rest back, the newcomer gets its
    share. The service never promises more than the mailbox."""
    async with raw_client(server.url) as first, raw_client(server.url) as second:
        old, _ = first.pair("gate", "old")
        await first.read_until(lambda: old.link_credit == MAILBOX)
        new, _ = second.pair("gate", "new")
        await second.wait_attached(new)
        assert new.link_credit == 0
        # the drain is on its way to `first`; before reading it, `first` sends a call
        crossing, _ = first.request(old, "ping")
        await first.read_until(lambda: old.drain)
        drains = [f for f in first.of(Flow, handle=old.remote_handle) if f.drain]
        assert drains and drains[0].link_credit == MAILBOX  # asked back, not lowered
        assert wire.parse_reply(await first.wait_reply(crossing)) == "pong"
        assert not first.of(Detach)
        first.engine.complete_drain(old)  # nothing more to send: the rest goes back
        await first.flush()
        share = (MAILBOX - MAILBOX // RESERVE_DIVISOR) // 2
        await second.read_until(lambda: new.link_credit == share)
        await first.read_until(lambda: old.link_credit == share and not old.drain)
        assert actor.outstanding == 2 * share == MAILBOX and actor.held == 0
        assert actor.peak == 1


async def test_lp10_pipelined_first_call_with_room_succeeds_while_another_caller_holds_the_rest(
    gate: Gate,
) -> None:
    """With a mailbox of 64, two slots are kept for callers that hold nothing: a caller that
    fills everything else does not stop a new caller's pipelined first call."""
    mailbox = 64
    reserve = mailbox // RESERVE_DIVISOR
    box = hosted(gate, mailbox=mailbox, max_concurrency=mailbox)
    async with (
        open_server(box, listen="amqp://127.0.0.1:0", grace=0.5) as server,
        raw_client(server.url) as busy,
        raw_client(server.url) as newcomer,
    ):
        actor = server.actors["gate"]
        sender, _ = busy.pair("gate", "busy")
        await busy.read_until(lambda: sender.link_credit == mailbox - reserve)
        for i in range(mailbox - reserve):
            busy.request(sender, "hold", i)
        await busy.flush()
        await wait_for(lambda: gate.running == mailbox - reserve)
        late, _ = newcomer.pair("gate", "late")
        mid, _ = newcomer.request(late, "ping")  # attach, attach, flow, transfer: one write
        assert wire.parse_reply(await newcomer.wait_reply(mid)) == "pong"
        request_half = newcomer.link_frames("late", ROLE_RECEIVER)
        assert [type(f) for f in request_half[:2]] == [Attach, Flow]
        assert request_half[1].link_credit >= 1
        assert actor.peak <= mailbox
        for _ in range(mailbox):
            gate.permits.release()


async def test_lp10_pipelined_first_call_without_room_is_detached_with_transfer_limit_exceeded(
    server: Server, gate: Gate, actor: Actor
) -> None:
    async with raw_client(server.url) as busy, raw_client(server.url) as newcomer:
        sender, _ = busy.pair("gate", "busy")
        await busy.read_until(lambda: sender.link_credit == MAILBOX)
        for i in range(MAILBOX):
            busy.request(sender, "hold", i)
        await busy.flush()
        await wait_for(lambda: gate.running == MAILBOX)
        late, _ = newcomer.pair("gate", "late")
        newcomer.request(late, "ping")  # pipelined, with no room anywhere
        await newcomer.read_until(
            lambda: any(isinstance(f, Detach) for f in newcomer.link_frames("late", ROLE_RECEIVER))
        )
        attach, detach = newcomer.link_frames("late", ROLE_RECEIVER)  # no flow: no credit
        assert isinstance(attach, Attach) and isinstance(detach, Detach)
        assert detach.closed is True and detach.error is not None
        assert detach.error.condition == errors.TRANSFER_LIMIT_EXCEEDED
        # the refused call was never held, let alone run
        assert gate.pings == 0 and actor.held == MAILBOX and actor.peak == MAILBOX
        # the caller may attach again and wait for credit: it comes with the next free slot
        again, _ = newcomer.pair("gate", "again")
        await newcomer.wait_attached(again)
        gate.permits.release()
        await newcomer.read_until(lambda: again.link_credit > 0)
        mid, _ = newcomer.request(again, "ping")
        assert wire.parse_reply(await newcomer.wait_reply(mid)) == "pong"


@asynccontextmanager
async def two_callers(
    gate: Gate, mailbox: int, max_concurrency: int
) -> AsyncIterator[tuple[Server, RawClient, RawClient]]:
    """``gate`` served with its own mailbox and workers, and two callers connected to it."""
    box = hosted(gate, mailbox=mailbox, max_concurrency=max_concurrency)
    async with (
        open_server(box, listen="amqp://127.0.0.1:0", grace=0.5) as server,
        raw_client(server.url) as first,
        raw_client(server.url) as second,
    ):
        yield server, first, second


async def test_queued_calls_are_taken_callers_in_turn(gate: Gate) -> None:
    """One worker, a mailbox of 8: a caller's queued backlog delays another caller's call by one
    turn, not by the backlog."""
    async with two_callers(gate, 8, 1) as (server, busy, other):
        actor = server.actors["gate"]
        sender, _ = busy.pair("gate", "busy")
        await busy.read_until(lambda: sender.link_credit == 8)
        ids = [busy.request(sender, "hold", i)[0] for i in range(8)]
        await busy.flush()
        await wait_for(lambda: actor.held == 8 and actor.queued == 7)
        late, _ = other.pair("gate", "late")
        await other.wait_attached(late)
        gate.permits.release()  # hold 0 ends, hold 1 starts: the freed slot is the newcomer's
        await busy.wait_reply(ids[0])
        await other.read_until(lambda: late.link_credit > 0)
        mid, _ = other.request(late, "ping")
        await other.flush()
        await wait_for(lambda: actor.queued == 7)  # holds 2..7, and the ping
        gate.permits.release()  # hold 1 ends; hold 2's turn came before the ping's
        gate.permits.release()  # hold 2 ends: the ping's turn, ahead of holds 3..7
        assert wire.parse_reply(await other.wait_reply(mid)) == "pong"
        assert gate.order[:4] == [0, 1, 2, "ping"]
        for _ in range(8):
            gate.permits.release()


async def test_idle_credit_at_its_share_is_drained_for_a_caller_holding_nothing(
    gate: Gate,
) -> None:
    """A mailbox of one and two callers: each share is the one slot. The caller holding it as
    credit and sending nothing is asked to drain, so the other's call is not kept out for as
    long as that link stays quiet."""
    async with two_callers(gate, 1, 1) as (_, idle, other):
        quiet, _ = idle.pair("gate", "quiet")
        await idle.read_until(lambda: quiet.link_credit == 1)
        late, _ = other.pair("gate", "late")
        await other.wait_attached(late)
        assert late.link_credit == 0
        await idle.read_until(lambda: quiet.drain)
        idle.engine.complete_drain(quiet)  # nothing to send: the slot goes back
        await idle.flush()
        await other.read_until(lambda: late.link_credit == 1)
        mid, _ = other.request(late, "ping")
        assert wire.parse_reply(await other.wait_reply(mid)) == "pong"


async def test_a_freed_slot_goes_to_the_caller_that_waited_not_back_to_its_holder(
    gate: Gate,
) -> None:
    """A mailbox of one: ``busy`` holds the slot with a call and wants credit for its next;
    ``late`` comes after and waits. When the call ends, the slot is ``late``'s turn."""
    async with two_callers(gate, 1, 1) as (server, busy, other):
        actor = server.actors["gate"]
        sender, _ = busy.pair("gate", "busy")
        await busy.read_until(lambda: sender.link_credit == 1)
        first, _ = busy.request(sender, "hold", 0)
        await busy.flush()
        await wait_for(lambda: gate.running == 1)
        late, _ = other.pair("gate", "late")
        await other.wait_attached(late)
        gate.permits.release()
        await busy.wait_reply(first)
        await other.read_until(lambda: late.link_credit == 1)
        assert sender.link_credit == 0 and server_link(actor, "busy").ledger.granted == 0
        mid, _ = other.request(late, "ping")
        assert wire.parse_reply(await other.wait_reply(mid)) == "pong"
