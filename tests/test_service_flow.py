"""Back-pressure: the credit a service grants is its free mailbox slots, over any number of links.

No timers: the handler waits on a semaphore the test releases, and "the credit on the wire" is
read exactly by asking the server to echo its flow state for a link (``flow.echo``), so every
assertion is about a credit value or a queue length at a known moment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from pairlink import connect, handler, open_server, service
from pairlink._amqp.link import Link
from pairlink._amqp.performatives import Flow
from pairlink._rpc import wire
from pairlink._server.actor import Actor
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, wait_for

BOUND = 4


@service("slow", mailbox=BOUND)
class Slow:
    def __init__(self) -> None:
        self.permits = trio.Semaphore(0)
        self.done = 0

    @handler
    async def hold(self, i: int) -> int:
        await self.permits.acquire()
        self.done += 1
        return i

    @handler(inline=True)  # answered on arrival: its slot is free before the next grant
    def add(self, a: int, b: int) -> int:
        return a + b


@pytest.fixture
async def svc() -> Slow:
    return Slow()


@pytest.fixture
async def server(svc: Slow) -> AsyncIterator[Server]:
    async with open_server(svc, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


@pytest.fixture
def actor(server: Server) -> Actor:
    return server.actors["slow"]


@pytest.fixture
async def raw(server: Server) -> AsyncIterator[RawClient]:
    async with raw_client(server.url) as c:
        yield c


async def wire_credit(raw: RawClient, pair: tuple[Link, Link]) -> int:
    """The credit the server holds out on the pair's request link right now, as it says on
    the wire. Both halves ask for an echo in one write; the server answers both back to back
    (one ``receive_data``, nothing can come between), so the request half's flow just before
    the reply half's echo is the answer, whatever grant flows were already on their way."""
    sender, receiver = pair
    await raw.wait_attached(sender)
    await raw.wait_attached(receiver)
    echoes = len(raw.of(Flow, handle=receiver.remote_handle))
    raw.engine.flow(sender, 0, echo=True)
    raw.engine.flow(receiver, receiver.link_credit, echo=True)
    await raw.read_until(lambda: len(raw.of(Flow, handle=receiver.remote_handle)) > echoes)
    flows = raw.of(Flow)
    last = max(i for i, f in enumerate(flows) if f.handle == receiver.remote_handle)
    answer = flows[last - 1]
    assert answer.handle == sender.remote_handle and answer.link_credit is not None
    return int(answer.link_credit)


async def test_credit_on_the_wire_is_the_free_mailbox_slots(
    raw: RawClient, svc: Slow, actor: Actor
) -> None:
    pair = raw.pair("slow")
    sender = pair[0]
    assert await wire_credit(raw, pair) == BOUND
    ids = [raw.request(sender, "hold", i)[0] for i in range(BOUND)]
    await raw.flush()
    await wait_for(lambda: actor.held == BOUND and actor.running == 1)
    assert actor.queued == BOUND - 1
    assert await wire_credit(raw, pair) == 0  # a full mailbox: the caller must wait
    # While the link is at or below half its share (4 // 2), every freed slot is credit at
    # once; above that no flow is sent for it until the caller has used half (batching).
    expected = [1, 2, 3, 3]
    for n, mid in enumerate(ids, start=1):
        svc.permits.release()
        assert wire.parse_reply(await raw.wait_reply(mid)) == n - 1
        await wait_for(lambda n=n: actor.held == BOUND - n)  # type: ignore[misc]
        credit = await wire_credit(raw, pair)
        assert credit == expected[n - 1] <= BOUND - actor.held
    raw.request(sender, "add", 1, 1)  # uses one: at 2 the link is topped up to its share
    await raw.read_until(lambda: sender.link_credit == BOUND)


async def test_many_links_of_one_caller_take_turns_and_never_hold_more_than_the_bound(
    raw: RawClient, svc: Slow, actor: Actor
) -> None:
    links = 6
    pairs = [raw.pair("slow", f"p{k}") for k in range(links)]
    senders = [sender for sender, _ in pairs]
    credits = [await wire_credit(raw, p) for p in pairs]
    # the first link, alone when it came, got the whole mailbox; the later ones none at all
    assert credits == [BOUND] + [0] * (links - 1)
    # it holds more than its part while the others wait: it is asked to drain
    first = senders[0]
    await raw.read_until(lambda: first.drain)
    raw.engine.complete_drain(first)  # nothing to send: the credit goes back
    await raw.read_until(lambda: sum(s.link_credit for s in senders) == BOUND)
    assert [s.link_credit for s in senders] == [0, 1, 1, 1, 1, 0]  # a part is one credit
    ids = [raw.request(s, "hold", k)[0] for k, s in enumerate(senders) if s.link_credit]
    await raw.flush()
    await wait_for(lambda: actor.held == BOUND)
    assert actor.outstanding == 0
    # each freed slot goes to the link whose turn it is: the two that waited, then the ones
    # that have used theirs, in the order they did
    granted: list[int] = []
    for n, mid in enumerate(ids, start=1):
        svc.permits.release()
        await raw.wait_reply(mid)
        await raw.read_until(lambda n=n: sum(s.link_credit for s in senders) == n)  # type: ignore[misc]
        granted += [k for k, s in enumerate(senders) if s.link_credit and k not in granted]
        assert sum([await wire_credit(raw, p) for p in pairs]) + actor.held == BOUND
    assert granted == [5, 0, 1, 2]
    assert actor.peak == BOUND


async def test_a_caller_that_grants_no_reply_credit_only_holds_its_own_slots(
    raw: RawClient, actor: Actor
) -> None:
    pair = sender, receiver = raw.pair("slow", reply_credit=0)
    ids = [raw.request(sender, "add", i, i)[0] for i in range(BOUND)]
    await raw.flush()
    # answered, but the replies wait for the caller's credit, still holding their slots
    await wait_for(lambda: actor.held == BOUND and actor.queued == actor.running == 0)
    assert await wire_credit(raw, pair) == 0
    raw.engine.flow(receiver, 10)
    for i, mid in enumerate(ids):
        assert wire.parse_reply(await raw.wait_reply(mid)) == 2 * i
    await wait_for(lambda: actor.held == 0)
    assert await wire_credit(raw, pair) == BOUND
    # the four slots freed by one reply-credit flow came back in one flow frame, not four
    await raw.read_until(lambda: len(raw.of(Flow, handle=sender.remote_handle)) == 4)
    grants = [f.link_credit for f in raw.of(Flow, handle=sender.remote_handle)]
    assert sorted(grants) == [0, BOUND, BOUND, BOUND]  # attach, two echoes, one grant


async def test_a_slow_service_pushes_back_on_every_caller(
    server: Server, svc: Slow, actor: Actor
) -> None:
    callers, calls = 3, 10
    results: list[int] = []

    async def caller(k: int) -> None:
        async with connect(server.url, timeout=10) as client:
            proxy = await client.service("slow")
            async with trio.open_nursery() as nursery:
                for i in range(calls):

                    async def one(i: int = i) -> None:
                        results.append(await proxy.hold(k * calls + i))

                    nursery.start_soon(one)

    async with trio.open_nursery() as nursery:
        for k in range(callers):
            nursery.start_soon(caller, k)
        await wait_for(lambda: len(actor.links) == callers and actor.outstanding == 0)
        # every caller is blocked on credit (a pipelined first call that found no room was
        # refused and sent again once credit came): the server holds the bound, no more
        assert actor.held == BOUND and results == []
        for _ in range(callers * calls):
            svc.permits.release()
    assert sorted(results) == list(range(callers * calls))
    assert actor.peak == BOUND
