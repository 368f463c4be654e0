"""How the actor runs each kind of handler under load (pairlink._server.actor), over real TCP:
``async def`` calls handed to one worker run one after another while they do not wait, and one
that waits lets the next run in another worker; a thread's lone reply written at once, even one
too big for one write, and replies batched behind it, all arrive whole; calls queued while
thread calls use all the concurrency start as those end, with no worker task."""

from __future__ import annotations

from typing import Any

import trio

from pairlink import connect, handler, hosted, open_server, service
from tests.service_peers import wait_for

URL = "amqp://127.0.0.1:0"
TIMEOUT = 10
BIG = 3 << 20
"""Past what one non-blocking write takes on loopback: the writer sends the rest."""


@service("kinds", max_concurrency=4)
class Kinds:
    def __init__(self) -> None:
        self.gate = trio.Event()
        self.order: list[int] = []

    @handler
    async def wait(self) -> str:
        await self.gate.wait()
        return "waited"

    @handler
    async def quick(self, x: Any) -> Any:
        return x

    @handler
    def blob(self, size: int) -> bytes:
        return b"x" * size

    @handler
    def echo(self, x: int) -> int:
        self.order.append(x)
        return x


async def test_an_async_call_that_waits_does_not_hold_back_the_ones_handed_over_with_it() -> None:
    kinds = Kinds()
    async with (
        open_server(hosted(kinds), listen=URL) as server,
        connect(server.url, timeout=TIMEOUT) as client,
    ):
        actor = server.actors["kinds"]
        results: list[Any] = []

        async def call(operation: str, *args: Any) -> None:
            results.append(await client.call("kinds", operation, *args))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "wait")
            for i in range(3):  # likely handed over in the same batch as the waiting one
                nursery.start_soon(call, "quick", i)
            await wait_for(lambda: len(results) == 3)
            assert actor.running == 1  # the waiting call, alone
            for i in range(3, 40):  # more than max_concurrency, while one still waits
                nursery.start_soon(call, "quick", i)
            await wait_for(lambda: len(results) == 40)
            kinds.gate.set()
    assert results[-1] == "waited" and sorted(results[:-1]) == list(range(40))


async def test_thread_replies_written_at_once_or_batched_arrive_whole_and_in_order() -> None:
    kinds = Kinds()
    async with (
        open_server(hosted(kinds), listen=URL, grace=1) as server,
        connect(server.url, timeout=30) as client,
    ):
        proxy = await client.service("kinds")
        assert len(await proxy.blob(BIG)) == BIG  # lone: written at once, the rest by the writer
        sizes: list[int] = []
        echoed: list[int] = []

        async def big() -> None:
            sizes.append(len(await proxy.blob(BIG)))

        async def small(i: int) -> None:
            echoed.append(await proxy.echo(i))

        for _ in range(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(big)
                for i in range(20):
                    nursery.start_soon(small, i)
            assert sizes == [BIG] and sorted(echoed) == list(range(20))
            sizes.clear()
            echoed.clear()


async def test_calls_queued_behind_busy_threads_all_start_as_room_frees() -> None:
    """With one call at a time, the queued def calls start one by one as the previous
    thread's call is answered: none is left behind without a worker task to start it."""
    kinds = Kinds()
    async with (
        open_server(hosted(kinds, max_concurrency=1), listen=URL) as server,
        connect(server.url, timeout=TIMEOUT) as client,
    ):
        actor = server.actors["kinds"]
        proxy = await client.service("kinds")
        got: list[int] = []

        async def echo(i: int) -> None:
            got.append(await proxy.echo(i))

        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(echo, i)
        assert actor.peak > 1  # some were queued behind a running one
        assert (actor.running, actor.queued) == (0, 0)
    assert sorted(got) == sorted(kinds.order) == list(range(30))
