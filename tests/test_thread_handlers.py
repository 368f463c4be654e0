"""Plain ``def`` handlers in the actor's own threads (pairlink._server.threads), over real TCP:
``max_concurrency`` holds however the calls arrive and whatever kind the others are, the handler
sees its call, the 408 of a call queued past its deadline, failures answered as a task's would
be, and a stopped server leaves no thread behind, idle or busy when it stopped."""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any

import pytest
import trio
import trio.testing

from pairlink import (
    CallContext,
    CallError,
    Proceed,
    RemoteError,
    connect,
    current_call,
    handler,
    hosted,
    open_server,
    service,
)
from pairlink._rpc import deadline, wire
from pairlink._rpc.tracing import current_trace, use_trace
from tests.service_peers import app_property, raw_client, status, wait_for

URL = "amqp://127.0.0.1:0"
TIMEOUT = 10  # seconds a handler waits for the test at most: only a failing test waits so long

_var: ContextVar[str] = ContextVar("test_thread_handlers", default="unset")


class Refused(Exception):
    pass


@service("gate", max_concurrency=4, expose_errors=Refused)
class Gate:
    """Handlers that hold their thread until the test opens the gate, counting how many run."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.open = False
        self.active = 0
        self.most = 0
        self.entered = 0
        self.ran_async = False

    def enter(self) -> None:
        with self.cond:
            self.active += 1
            self.most = max(self.most, self.active)
            self.entered += 1
            self.cond.notify_all()
            held = self.cond.wait_for(lambda: self.open, timeout=TIMEOUT)
            self.active -= 1
        if not held:
            raise RuntimeError("the gate never opened")

    async def wait_entered(self, count: int) -> None:
        """Until ``count`` handlers in all have entered (without holding the event loop)."""

        def wait() -> None:
            with self.cond:
                if not self.cond.wait_for(lambda: self.entered >= count, timeout=TIMEOUT):
                    raise AssertionError(f"{self.entered} handlers entered, not {count}")

        await trio.to_thread.run_sync(wait)

    def release(self) -> None:
        with self.cond:
            self.open = True
            self.cond.notify_all()

    @handler
    def hold(self, i: int) -> int:
        self.enter()
        return i

    @handler
    async def hold_async(self) -> str:
        self.ran_async = True
        return "ran"

    @handler
    def echo(self, x: Any) -> Any:
        return x

    @handler
    def context(self) -> dict[str, Any]:
        call = current_call()
        trace = current_trace()
        previous = _var.get()
        _var.set("set by an earlier call")  # must not leak into the next call in this thread
        return {
            "operation": call.operation,
            "service": call.service,
            "left": deadline.remaining(),
            "trace": None if trace is None else trace.trace_id,
            "var": previous,
            "thread": threading.current_thread() is threading.main_thread(),
        }

    @handler
    def fail(self, how: str) -> None:
        if how == "call-error":
            raise CallError(409, "taken", "Conflict")
        if how == "exposed":
            raise Refused("not today")
        raise RuntimeError("secret connection string")


def _pool_threads(address: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"pairlink-{address}-")]


@pytest.mark.parametrize("limit", [1, 4])
async def test_no_more_def_handlers_run_at_once_than_max_concurrency(limit: int) -> None:
    gate = Gate()
    calls = 40
    async with open_server(hosted(gate, max_concurrency=limit), listen=URL) as server:
        actor = server.actors["gate"]
        async with connect(server.url, timeout=TIMEOUT) as client:
            results: list[int] = []

            async def hold(i: int) -> None:
                results.append(await client.call("gate", "hold", i))

            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(hold, i)
                await gate.wait_entered(limit)
                await wait_for(lambda: actor.held == calls)
                assert (actor.running, actor.queued) == (limit, calls - limit)
                assert gate.most == limit
                gate.release()
    assert sorted(results) == list(range(calls))
    assert gate.most == limit  # 1: the handlers never overlapped
    assert len(_pool_threads("gate")) == 0


async def test_an_async_call_waits_while_def_handlers_use_all_the_concurrency() -> None:
    """Calls in threads hold no worker task, yet the workers count them."""
    gate = Gate()
    async with open_server(hosted(gate, max_concurrency=2), listen=URL) as server:
        actor = server.actors["gate"]
        async with connect(server.url, timeout=TIMEOUT) as client:
            results: list[Any] = []

            async def call(operation: str, *args: Any) -> None:
                results.append(await client.call("gate", operation, *args))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "hold", 1)
                nursery.start_soon(call, "hold", 2)
                await gate.wait_entered(2)
                nursery.start_soon(call, "hold_async")
                await wait_for(lambda: actor.queued == 1)
                assert actor.running == 2 and not gate.ran_async
                gate.release()
    assert sorted(results, key=str) == [1, 2, "ran"]


async def test_a_def_handler_sees_its_call_its_deadline_and_trace_and_a_context_of_its_own() -> (
    None
):
    async with (
        open_server(hosted(Gate, max_concurrency=1), listen=URL) as server,
        connect(server.url, timeout=TIMEOUT) as client,
    ):
        with use_trace() as trace:
            first = await client.call("gate", "context", timeout=30)
        second = await client.call("gate", "context", timeout=5)
    assert first["operation"] == "context" and first["service"] == "gate"
    assert 29 < first["left"] <= 30
    assert first["trace"] == trace.trace_id
    assert first["thread"] is False  # not the event loop's
    # the same thread ran both (max_concurrency=1); what the first set did not stay
    assert (first["var"], second["var"]) == ("unset", "unset")
    assert 4 < second["left"] <= 5 and second["trace"] is None


async def test_a_def_handlers_failures_are_answered_as_an_async_handlers() -> None:
    async with (
        open_server(Gate(), listen=URL) as server,
        connect(server.url, timeout=TIMEOUT) as client,
    ):
        with pytest.raises(RemoteError) as exc:
            await client.call("gate", "fail", "call-error")
        assert (exc.value.status, exc.value.type, exc.value.message) == (409, "Conflict", "taken")
        with pytest.raises(RemoteError) as exc:
            await client.call("gate", "fail", "exposed")
        assert exc.value.status == 500 and exc.value.message == "not today"
        assert exc.value.type == f"{__name__}.Refused"
        with pytest.raises(RemoteError) as exc:
            await client.call("gate", "fail", "other")
        assert exc.value.status == 500 and exc.value.ref is not None
        assert "secret" not in exc.value.message
        assert await client.call("gate", "echo", "still serving") == "still serving"


async def test_408_without_running_when_the_deadline_passes_while_queued(
    io_clock: trio.testing.MockClock,
) -> None:
    gate = Gate()
    async with (
        open_server(hosted(gate, max_concurrency=1), listen=URL) as server,
        raw_client(server.url) as raw,
    ):
        sender, _ = raw.pair("gate")
        first, _ = raw.request(sender, "hold", 1)
        late, _ = raw.request(sender, "hold", 2, timeout=0.2)
        after, _ = raw.request(sender, "nope")  # answered on arrival, so `late` has arrived
        assert status(await raw.wait_reply(after)) == 404
        await gate.wait_entered(1)
        assert raw.reply_to(late) is None  # queued behind the first, which holds the thread
        await trio.sleep(0.3)  # its deadline passes (on the mock clock)
        gate.release()
        reply = await raw.wait_reply(late)
        assert status(reply) == 408
        assert app_property(reply, wire.STATUS_DESCRIPTION) == (
            "the deadline passed while the call was queued"
        )
        assert wire.parse_reply(await raw.wait_reply(first)) == 1
    assert gate.entered == 1


async def test_middleware_runs_around_a_def_handler_in_its_thread() -> None:
    async def mark(call: CallContext, proceed: Proceed) -> Any:
        token = _var.set(f"middleware of {call.operation}")
        try:
            return await proceed()
        finally:
            _var.reset(token)

    @service("marked", middleware=[mark])
    class Marked:
        @handler
        def seen(self) -> tuple[str, bool]:
            return _var.get(), threading.current_thread() is threading.main_thread()

    async with (
        open_server(Marked(), listen=URL) as server,
        connect(server.url, timeout=TIMEOUT) as client,
    ):
        assert await client.call("marked", "seen") == ["middleware of seen", False]


def _threads() -> set[threading.Thread]:
    """The live threads but trio's cache (``to_thread``'s, idle for a while after use)."""
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


async def test_a_stop_answers_the_queued_call_503_and_waits_for_a_busy_thread(
    io_clock: trio.testing.MockClock,
) -> None:
    """The running handler cannot be interrupted: the stop waits for it, and its caller gets
    its answer; the call queued behind it gets its 503 as soon as the grace is over."""
    before = _threads()
    gate = Gate()
    async with (
        open_server(hosted(gate, max_concurrency=1), listen=URL, grace=0.2) as server,
        raw_client(server.url) as raw,
    ):
        actor = server.actors["gate"]
        sender, _ = raw.pair("gate")
        running, _ = raw.request(sender, "hold", 1)
        queued, _ = raw.request(sender, "hold", 2)
        await raw.flush()
        await gate.wait_entered(1)
        await wait_for(lambda: actor.queued == 1)
        server.stop()
        reply = await raw.wait_reply(queued)  # the grace passes on the mock clock
        assert status(reply) == 503 and actor.aborting
        assert not actor.finished.is_set() and raw.reply_to(running) is None
        gate.release()
        assert wire.parse_reply(await raw.wait_reply(running)) == 1
    assert actor.finished.is_set() and gate.entered == 1
    assert _pool_threads("gate") == [] and _threads() == before


async def test_stopped_servers_leave_no_idle_threads_behind() -> None:
    before = _threads()
    for _ in range(5):
        gate = Gate()
        async with (
            open_server(gate, listen=URL) as server,
            connect(server.url, timeout=TIMEOUT) as client,
        ):
            async with trio.open_nursery() as nursery:
                for i in range(4):  # four at once: four threads
                    nursery.start_soon(client.call, "gate", "hold", i)
                await gate.wait_entered(4)
                assert len(_pool_threads("gate")) == 4
                gate.release()
            assert await client.call("gate", "echo", 1) == 1  # the threads are idle now
        assert _pool_threads("gate") == []
    assert _threads() == before
