"""Lifecycle: on_start/on_stop, graceful shutdown on cancel, actor-to-actor calls, echo."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
import trio
import trio.testing
from structlog.testing import capture_logs

from pairlink import connect, handler, open_server, remote, serve, service
from pairlink._amqp.performatives import Close, Detach
from pairlink._rpc import deadline, wire
from pairlink._server.serving import Server
from pairlink.errors import RemoteError
from services.echo import Echo
from tests.service_peers import raw_client, status, wait_for

URL = "amqp://127.0.0.1:0"


async def start_serving(
    nursery: trio.Nursery, *services: object, **options: Any
) -> tuple[Server, trio.CancelScope]:
    """``serve`` in a task of its own, and the scope whose cancellation stops it."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[Server]) -> None:
        with scope:
            await serve(*services, listen=URL, task_status=task_status, **options)

    return await nursery.start(run), scope


@service("keeper")
class Keeper:
    def __init__(self, events: list[str] | None = None, fail_start: bool = False) -> None:
        self.events = [] if events is None else events
        self.fail_start = fail_start
        self.gate = trio.Event()
        self.ran: list[int] = []

    async def on_start(self) -> None:
        if self.fail_start:
            raise RuntimeError("no database")
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    @handler
    def state(self) -> list[str]:
        return self.events

    @handler
    async def wait(self, i: int) -> int:
        await self.gate.wait()
        self.ran.append(i)
        return i


async def test_on_start_runs_before_serving_and_on_stop_after() -> None:
    keeper = Keeper()
    async with open_server(keeper, listen=URL) as server, connect(server.url) as client:
        assert await client.call("keeper", "state") == ["start"]
    assert keeper.events == ["start", "stop"]


async def test_on_start_failure_stops_the_services_already_started() -> None:
    events: list[str] = []

    @service("second")
    class Second(Keeper):
        pass

    with pytest.raises(RuntimeError, match="no database"):
        async with open_server(Keeper(events), Second(events, fail_start=True), listen=URL):
            pytest.fail("must not serve")
    assert events == ["start", "stop"]


async def test_open_server_cancelled_before_it_listens_returns_at_once() -> None:
    """Cancelled as it starts: the start is given up (it used to listen anyway, shielded, and
    then wait forever for a stop nobody would ask for); on_stop still follows on_start."""
    events: list[str] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        async with open_server(Keeper(events), listen=URL):
            pytest.fail("must not serve")
    assert scope.cancelled_caught
    assert events == ["start", "stop"]


async def test_open_server_cancelled_as_it_begins_to_listen_returns_at_once() -> None:
    """The narrowest window: cancelled after the start's last checkpoint (here, by the log
    line that says it listens), just before it would report itself started."""
    events: list[str] = []
    scope = trio.CancelScope()

    def cancel_when_listening(_logger: Any, _method: str, event: Any) -> Any:
        if event["event"] == "server.listening":
            scope.cancel()
        return event

    with capture_logs() as logs:
        structlog.get_config()["processors"].insert(0, cancel_when_listening)
        with scope:
            async with open_server(Keeper(events), listen=URL):
                pytest.fail("must not serve")
    assert scope.cancelled_caught
    assert "server.listening" in [e["event"] for e in logs]
    assert events == ["start", "stop"]


async def test_cancelling_open_server_cancels_a_pending_on_start() -> None:
    events: list[str] = []
    starting = trio.Event()

    @service("stuck")
    class Stuck(Keeper):
        async def on_start(self) -> None:
            starting.set()
            try:
                await trio.sleep_forever()  # a database that never answers
            finally:
                self.events.append("start cancelled")

    async def serve_both() -> None:
        async with open_server(Keeper(events), Stuck(events), listen=URL):
            pytest.fail("must not serve")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_both)
        await starting.wait()
        nursery.cancel_scope.cancel()
    # the service whose on_start finished is stopped; the stuck one never started
    assert events == ["start", "start cancelled", "stop"]


async def test_cancelling_serve_answers_held_calls_then_detaches_and_closes() -> None:
    keeper = Keeper()
    async with trio.open_nursery() as nursery:
        server, serving = await start_serving(nursery, keeper)
        actor = server.actors["keeper"]
        async with raw_client(server.url) as raw:
            sender, _ = raw.pair("keeper")
            ids = [raw.request(sender, "wait", i)[0] for i in range(3)]
            await raw.flush()
            await wait_for(lambda: actor.held == 3 and actor.running == 1)
            serving.cancel()
            await wait_for(lambda: actor.stopping)
            # credit is taken back; a link attached now gets the one credit LP-10 needs,
            # and its call is answered 503 at once
            late_sender, _ = raw.pair("keeper", "late")
            late, _ = raw.request(late_sender, "wait", 99)
            assert status(await raw.wait_reply(late)) == 503
            keeper.gate.set()  # the held calls finish within the grace period: all answered
            for i, mid in enumerate(ids):
                reply = await raw.wait_reply(mid)
                assert status(reply) == 200 and wire.parse_reply(reply) == i
            await raw.read_until(lambda: bool(raw.of(Close)))
            assert {d.closed for d in raw.of(Detach)} == {True}
            assert len(raw.of(Detach)) == 4  # both halves of both pairs, before the close
    assert keeper.ran == [0, 1, 2] and keeper.events == ["start", "stop"]


async def test_after_the_grace_period_calls_are_cut_short_with_503(
    io_clock: trio.testing.MockClock,
) -> None:
    keeper = Keeper()
    async with trio.open_nursery() as nursery:
        server, serving = await start_serving(nursery, keeper, grace=0.2)
        actor = server.actors["keeper"]
        async with raw_client(server.url) as raw:
            sender, _ = raw.pair("keeper")
            running, _ = raw.request(sender, "wait", 1)
            queued, _ = raw.request(sender, "wait", 2)
            await raw.flush()
            await wait_for(lambda: actor.held == 2 and actor.running == 1)
            stopped_at = trio.current_time()
            serving.cancel()  # and the gate never opens
            replies = [await raw.wait_reply(mid) for mid in (running, queued)]
            assert [status(reply) for reply in replies] == [503, 503]
            assert trio.current_time() - stopped_at == pytest.approx(0.2)  # the grace, no more
    assert keeper.ran == []


async def test_a_queued_call_whose_caller_left_does_not_run() -> None:
    keeper = Keeper()
    async with open_server(keeper, listen=URL) as server:
        actor = server.actors["keeper"]
        async with raw_client(server.url) as raw:
            sender, _ = raw.pair("keeper")
            raw.request(sender, "wait", 1)
            raw.request(sender, "wait", 2)
            await raw.flush()
            await wait_for(lambda: actor.running == 1 and actor.queued == 1)
        await wait_for(lambda: not actor.links)  # the connection is gone
        keeper.gate.set()
        await wait_for(lambda: actor.held == 0)
    assert keeper.ran == [1]  # the running call finished; the queued one never started


async def test_a_failing_on_stop_is_logged_and_the_others_still_stop() -> None:
    events: list[str] = []

    @service("broken")
    class Broken(Keeper):
        async def on_stop(self) -> None:
            raise OSError("disk gone")

    async with open_server(Keeper(events), Broken(events), listen=URL):
        pass
    assert events == ["start", "start", "stop"]


# -- actor to actor ----------------------------------------------------------------------------


@service("front")
class Front:
    @handler
    async def relay(self, operation: str, *args: Any) -> Any:
        back = await remote("back")
        return await back.call(operation, *args)

    @handler
    async def outer_deadline(self) -> float | None:
        return deadline.remaining()


@service("back")
class Back:
    @handler
    async def time_left(self) -> float | None:
        return deadline.remaining()

    @handler
    def fail(self) -> None:
        raise KeyError("missing")


async def test_a_handler_calls_another_service_and_its_deadline_travels(
    io_clock: trio.testing.MockClock,
) -> None:
    async with open_server(Front, Back, listen=URL) as server, connect(server.url) as client:
        inner = await client.call("front", "relay", "time_left", timeout=3)
        # the inner call got what was left of the outer deadline: on a clock that stands
        # still, all of it (to the millisecond of the wire's two hops), not its own 30 s
        assert inner == pytest.approx(3, abs=0.003)
        with pytest.raises(RemoteError) as exc:
            await client.call("front", "relay", "fail")
        # back told front nothing of its KeyError, and front tells its caller nothing more
        assert exc.value.status == 500 and exc.value.type is None and exc.value.ref
        assert "KeyError" not in exc.value.message and "missing" not in exc.value.message


async def test_remote_outside_a_service_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside a served handler"):
        await remote("back")


async def test_remote_from_on_start_needs_a_call_url() -> None:
    @service("early")
    class Early(Back):
        async def on_start(self) -> None:
            await remote("back")

    with pytest.raises(RuntimeError, match="pass call_url"):
        async with open_server(Early, listen=URL):
            pass


# -- the echo service --------------------------------------------------------------------------


async def test_echo_service_echoes_and_sleeps(io_clock: trio.testing.MockClock) -> None:
    async with open_server(Echo, listen=URL) as server, connect(server.url) as client:
        echo = await client.service("echo")
        assert await echo.echo("hi") == "hi"
        assert await echo.echo({"nested": [1, 2.5, None, b"raw"]}) == {
            "nested": [1, 2.5, None, b"raw"]
        }
        start = trio.current_time()
        assert await echo.sleep(0.01) is None
        assert trio.current_time() - start == pytest.approx(0.01)
        with pytest.raises(TimeoutError):
            await echo.options(timeout=0.1).call("sleep", 5)
