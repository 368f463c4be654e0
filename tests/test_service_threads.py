"""Plain ``def`` handlers run in worker threads: one that blocks stalls neither the other
services of its process nor the event loop, and no more than ``max_concurrency`` run at once."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

import pytest
import trio

from pairlink import Client, connect, handler, open_server, service
from pairlink._rpc import deadline
from pairlink._server.serving import Server
from pairlink.errors import RemoteError

BLOCKING = 3
"""Concurrency of the blocking service: more threads than one."""


@service("blocker", max_concurrency=BLOCKING)
class Blocker:
    """Plain ``def`` handlers that block their thread until the test lets them go."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)  # one release per handler that started
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0

    @handler
    def block(self) -> str:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        self.entered.release()
        try:
            if not self.release.wait(timeout=10):  # a real block, as time.sleep would be
                raise RuntimeError("never released")
        finally:
            with self.lock:
                self.active -= 1
        return "unblocked"

    @handler
    def time_left(self) -> float | None:
        return deadline.remaining()


@service("other")
class Other:
    @handler
    async def ping(self) -> str:
        return "pong"

    @handler(inline=True)
    def ping_inline(self) -> str:
        return "pong"


@pytest.fixture
async def blocker() -> Blocker:
    return Blocker()


@pytest.fixture
async def server(blocker: Blocker) -> AsyncIterator[Server]:
    async with open_server(blocker, Other(), listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Client]:
    async with connect(server.url, timeout=5) as c:
        yield c


async def _entered(blocker: Blocker, count: int) -> None:
    """Wait (without holding the event loop) until ``count`` more handlers have started."""
    for _ in range(count):
        await trio.to_thread.run_sync(blocker.entered.acquire)


async def test_a_blocked_def_handler_does_not_delay_another_services_calls(
    server: Server, client: Client, blocker: Blocker
) -> None:
    """The pings come from a thread with an event loop of its own, so they measure the
    server's: were it stalled by the block, they would wait for it (here, time out)."""
    results: list[str] = []

    async def pings() -> list[tuple[str, float]]:
        waits = []
        async with connect(server.url, timeout=2) as other:
            for operation in ("ping", "ping_inline") * 5:
                started = time.perf_counter()
                assert await other.call("other", operation) == "pong"
                waits.append((operation, time.perf_counter() - started))
        return waits

    def measure() -> list[tuple[str, float]]:
        try:
            if not blocker.entered.acquire(timeout=5):
                raise AssertionError("the block never started")
            return trio.run(pings)
        finally:
            blocker.release.set()

    async def block() -> None:
        results.append(await client.call("blocker", "block"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(block)
        waits = await trio.to_thread.run_sync(measure)
    assert results == ["unblocked"]
    # a round trip on 127.0.0.1 takes well under a millisecond: a generous bound
    slow = [(operation, f"{wait * 1e3:.0f} ms") for operation, wait in waits if wait >= 0.05]
    assert not slow, f"calls waited for the blocked handler: {slow}"


async def test_no_more_than_max_concurrency_threads_run_for_a_service(
    client: Client, blocker: Blocker, server: Server
) -> None:
    calls = BLOCKING * 2
    results: list[str] = []

    async def block() -> None:
        results.append(await client.call("blocker", "block"))

    async with trio.open_nursery() as nursery:
        for _ in range(calls):
            nursery.start_soon(block)
        await _entered(blocker, BLOCKING)
        # answered on arrival, after the blocks sent before it on the same link
        with pytest.raises(RemoteError) as exc:
            await client.call("blocker", "nope")
        assert exc.value.status == 404
        actor = server.actors["blocker"]
        assert (actor.running, actor.queued) == (BLOCKING, calls - BLOCKING)
        assert blocker.most == BLOCKING
        blocker.release.set()
    assert results == ["unblocked"] * calls
    assert blocker.most == BLOCKING


async def test_a_def_handler_sees_its_calls_deadline_in_its_thread(client: Client) -> None:
    left = await client.call("blocker", "time_left", timeout=30)
    assert left is not None and 29 < left <= 30
