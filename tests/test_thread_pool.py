"""The actor's thread pool on its own (pairlink._server.threads): jobs that block briefly run
side by side, a job held back by a blocked thread gets one of its own, each job
runs in a context of its own, and the pool ends its threads once stopped and drained."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import pytest
import trio
import trio.testing

from pairlink._server.threads import Result, ThreadPool

TIMEOUT = 10  # seconds a job waits for the test at most: only a failing test waits so long

_var: ContextVar[str] = ContextVar("test_thread_pool", default="unset")


class Outcomes:
    """The outcomes delivered to the event loop, by job argument."""

    def __init__(self) -> None:
        self.got: dict[Any, Result[Any]] = {}
        self._changed = trio.Event()

    def done(self, arg: Any, result: Result[Any]) -> None:
        self.got[arg] = result
        self._changed.set()

    async def wait(self, *args: Any) -> list[Any]:
        with trio.fail_after(TIMEOUT):
            while not all(arg in self.got for arg in args):
                self._changed = trio.Event()
                await self._changed.wait()
        return [self.got[arg].unwrap() for arg in args]


@asynccontextmanager
async def running_pool(limit: int, name: str) -> AsyncIterator[ThreadPool]:
    pool = ThreadPool(limit, name)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        try:
            yield pool
        finally:
            pool.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith(f"pairlink-{name}-")]


def _thread_name(_: Any) -> str:
    return threading.current_thread().name


async def test_jobs_that_block_briefly_run_side_by_side() -> None:
    """A thread taking a job while others wait wakes another at once: handlers that block for
    a few milliseconds each (a quick query) must not run one after another, as they would in
    a pool that waits to see its queue stall before it wakes more threads."""
    lock = threading.Lock()
    running = peak = 0

    def brief(_: Any) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.003)  # blocks, as I/O would: the GIL is free meanwhile
        with lock:
            running -= 1

    outcomes = Outcomes()
    async with running_pool(8, "brief") as pool:
        for i in range(8):
            pool.submit(brief, i, outcomes.done)
        await outcomes.wait(*range(8))
    assert peak >= 2


async def test_a_job_held_back_by_a_blocked_thread_gets_a_thread_of_its_own() -> None:
    go = threading.Event()
    outcomes = Outcomes()
    async with running_pool(4, "spill") as pool:
        pool.submit(lambda _: go.wait(TIMEOUT), "blocked", outcomes.done)
        pool.submit(_thread_name, "quick", outcomes.done)
        [name] = await outcomes.wait("quick")  # not after the blocked one
        assert "blocked" not in outcomes.got
        go.set()
        assert await outcomes.wait("blocked") == [True]
    assert name.startswith("pairlink-spill-")


async def test_each_job_runs_in_a_context_of_its_own_and_failures_come_back() -> None:
    def job(value: str) -> str:
        previous = _var.get()
        _var.set(value)  # must not leak into the next job run by this thread
        if value == "fail":
            raise ValueError("as raised in the thread")
        return previous

    outcomes = Outcomes()
    async with running_pool(1, "context") as pool:
        for value in ("a", "b", "fail", "c"):
            pool.submit(job, value, outcomes.done)
        assert await outcomes.wait("a", "b", "c") == ["unset"] * 3
        with pytest.raises(ValueError, match="as raised in the thread"):
            await outcomes.wait("fail")
        assert await pool.run_sync(_var.get) == "unset"


async def test_the_pool_ends_once_stopped_and_every_outcome_is_in() -> None:
    go = threading.Event()
    outcomes = Outcomes()
    ended = trio.Event()
    pool = ThreadPool(2, "ending")

    async def serve() -> None:
        await pool.run()
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.testing.wait_all_tasks_blocked()
        pool.submit(lambda _: go.wait(TIMEOUT), "busy", outcomes.done)
        pool.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not ended.is_set()  # the running job's outcome is still to come
        go.set()
        await ended.wait()
    assert outcomes.got["busy"].unwrap() is True
    assert not [t for t in threading.enumerate() if t.name.startswith("pairlink-ending-")]
