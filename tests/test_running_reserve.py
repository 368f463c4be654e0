"""Running slots are shared (issue 22): however many slow calls one caller keeps running, a
reserve of a service's running slots stays free for callers that run nothing, so another
caller's quick call starts at once instead of waiting for the slow ones to end.

Over real TCP: two clients of our own against a served service whose slow handler waits for
the test's permit (no timers).
"""

from __future__ import annotations

import trio

from pairlink import Client, Server, connect, handler, open_server, service
from pairlink._server.actor import Actor
from pairlink._server.mailbox import RESERVE_DIVISOR
from tests.service_peers import wait_for

CONCURRENCY = 64
RESERVE = CONCURRENCY // RESERVE_DIVISOR
SLOW_CALLS = 300  # more than the mailbox (128): some wait for credit, some queue, most run


@service("svc", max_concurrency=CONCURRENCY)
class Svc:
    def __init__(self) -> None:
        self.release = trio.Event()
        self.running = 0

    @handler
    async def slow(self) -> None:
        self.running += 1
        try:
            await self.release.wait()
        finally:
            self.running -= 1

    @handler
    async def quick(self) -> str:
        return "done"


async def fill(svc: Svc, server: Server, client: Client, nursery: trio.Nursery) -> Actor:
    """``client``'s slow calls, until they hold every running slot but the reserve and some
    wait in the queue; the service's actor."""
    actor = server.actors["svc"]
    for _ in range(SLOW_CALLS):
        nursery.start_soon(client.call, "svc", "slow")
    await wait_for(lambda: svc.running == CONCURRENCY - RESERVE and actor.queued > 0)
    return actor


async def test_a_quick_call_starts_beside_another_callers_slow_backlog() -> None:
    svc = Svc()
    async with (
        open_server(svc, listen="amqp://127.0.0.1:0") as server,
        connect(server.url, timeout=60) as first,
        connect(server.url, timeout=60) as second,
        trio.open_nursery() as nursery,
    ):
        # the first caller fills every running slot it may, and queues the rest
        await fill(svc, server, first, nursery)
        with trio.fail_after(5):
            assert await second.call("svc", "quick") == "done"
        assert svc.running == CONCURRENCY - RESERVE  # the backlog did not grow into the reserve
        svc.release.set()
    assert RESERVE == 2


async def test_a_lone_caller_leaves_the_reserve_idle_and_still_gets_every_call_run() -> None:
    svc = Svc()
    async with (
        open_server(svc, listen="amqp://127.0.0.1:0") as server,
        connect(server.url, timeout=60) as only,
        trio.open_nursery() as nursery,
    ):
        actor = await fill(svc, server, only, nursery)
        assert actor.running == CONCURRENCY - RESERVE
        svc.release.set()
        await wait_for(lambda: actor.held == 0, within=20)
