"""A Trio run in a thread of its own (pairlink._io.threads): start, calls in, stop, failures."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import trio

from pairlink._io.threads import TrioThread, start_trio_thread

FORK_WARNING = "ignore:This process.*is multi-threaded:DeprecationWarning"


class Boom(Exception):
    pass


async def serve_forever(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started(threading.current_thread().name)
    await trio.sleep_forever()


def test_the_started_value_comes_back_and_calls_run_in_the_trio_thread() -> None:
    thread = start_trio_thread(serve_forever, name="test-trio")
    assert thread.value == "test-trio"  # what the function saw: its own thread

    async def where(n: int) -> tuple[str, int]:
        await trio.lowlevel.checkpoint()
        return threading.current_thread().name, n * 2

    assert thread.run(where, 21) == ("test-trio", 42)
    assert thread.run_sync(lambda: threading.current_thread().name) == "test-trio"

    def fail() -> None:
        raise Boom("in the call")

    with pytest.raises(Boom, match="in the call"):  # raised in the calling thread
        thread.run_sync(fail)
    thread.stop()  # cancels sleep_forever
    thread.join()  # a cancelled function ended cleanly: nothing to raise
    with pytest.raises(trio.RunFinishedError):
        thread.run_sync(int)
    thread.stop()  # idempotent


def test_a_failure_before_started_is_raised_by_the_start() -> None:
    async def fail(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.lowlevel.checkpoint()
        raise Boom("no luck")

    with pytest.raises(Boom, match="no luck"):
        start_trio_thread(fail, name="test-trio")
    assert not [t for t in threading.enumerate() if t.name == "test-trio"]  # joined


def test_a_function_that_never_calls_started_fails_the_start() -> None:
    async def forgetful(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.lowlevel.checkpoint()

    with pytest.raises(RuntimeError, match="without calling started"):
        start_trio_thread(forgetful, name="test-trio")


def test_a_failure_after_started_is_raised_by_join() -> None:
    async def fail_later(*, task_status: trio.TaskStatus[trio.Event]) -> None:
        go = trio.Event()
        task_status.started(go)
        await go.wait()
        raise Boom("later")

    thread = start_trio_thread(fail_later, name="test-trio")
    thread.run_sync(thread.value.set)
    with pytest.raises(Boom, match="later"):
        thread.join()


def test_started_twice_is_an_error_of_the_function() -> None:
    async def twice(*, task_status: trio.TaskStatus[int]) -> None:
        task_status.started(1)
        task_status.started(2)

    thread = start_trio_thread(twice, name="test-trio")
    assert thread.value == 1
    with pytest.raises(RuntimeError, match="twice"):
        thread.join()


def report_ownership(thread: TrioThread[str], results: multiprocessing.Queue[bool]) -> None:
    results.put(thread.in_this_process)


@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_forked_child_knows_the_thread_is_not_its_own() -> None:
    thread = start_trio_thread(serve_forever, name="test-trio")
    try:
        assert thread.in_this_process
        context = multiprocessing.get_context("fork")
        results: multiprocessing.Queue[bool] = context.Queue()
        child = context.Process(target=report_ownership, args=(thread, results))
        child.start()
        assert results.get(timeout=30) is False
        child.join(30)
        assert child.exitcode == 0
    finally:
        thread.stop()
