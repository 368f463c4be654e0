"""Replicas as processes: three ``pairlink serve`` of the echo service, each on a port of its
own, under a steady pipelined load from one client. Restarted one after another with SIGTERM,
they lose no call; one killed with SIGKILL fails only the calls in flight on it, and calls
made a second later all succeed."""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import trio

from pairlink import connect
from pairlink._client.placement import LOST, READY
from pairlink._client.replicas import HEALTH_TIMEOUT
from pairlink.client import Client
from pairlink.errors import ConnectionLostError
from tests.gateway.chain import free_port
from tests.service_peers import wait_for
from tests.test_client_cli import Served, serving_each

CALLERS = 16
"""Callers, each with one call in flight at a time: a pipelined load on every replica."""
READY_WITHIN = 20.0
"""A guard, not a wait: a replica restarted is ready again well within it."""


def serve(url: str) -> Served:
    return Served("services.echo", "--listen", url)


@pytest.fixture
def urls() -> list[str]:
    return [f"amqp://127.0.0.1:{free_port()}" for _ in range(3)]


@pytest.fixture
def served(urls: list[str]) -> Iterator[list[Served]]:
    """A ``pairlink serve services.echo`` per URL, listening; a test may replace one."""
    yield from serving_each(urls, "services.echo")


class Load:
    """``CALLERS`` tasks calling echo in a loop until ``stop``; each call's start (Trio time)
    and its error, if any, are kept."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.answered: list[float] = []  # start of each call that succeeded
        self.failed: list[tuple[float, BaseException]] = []
        self.done = trio.Event()

    async def caller(self, number: int) -> None:
        echo = await self.client.service("echo")
        count = 0
        while not self.done.is_set():
            started = trio.current_time()
            try:
                assert await echo.echo([number, count]) == [number, count]
            except Exception as exc:
                self.failed.append((started, exc))
            else:
                self.answered.append(started)
            count += 1

    def answered_since(self, moment: float) -> int:
        return sum(1 for started in self.answered if started >= moment)

    def answered_since_at_least(self, moment: float, count: int) -> bool:
        return self.answered_since(moment) >= count


@contextlib.asynccontextmanager
async def loaded(urls: list[str]) -> AsyncIterator[tuple[Client, Load]]:
    """A client of the replicas at ``urls``, every one ready, under a steady load that has
    had 200 answers; the load stops as the block ends."""
    async with connect(urls, timeout=30, max_retry_delay=0.25) as client:
        await wait_for(lambda: all_ready(client), within=READY_WITHIN)
        load = Load(client)
        async with trio.open_nursery() as nursery:
            for number in range(CALLERS):
                nursery.start_soon(load.caller, number)
            await wait_for(lambda: len(load.answered) >= 200, within=READY_WITHIN)
            yield client, load
            load.done.set()


def not_ready(client: Client, index: int) -> bool:
    return client.replicas[index].state != READY


def all_ready(client: Client) -> bool:
    return all_ready_of(client, 3)


def all_ready_of(client: Client, count: int) -> bool:
    return [r.state for r in client.replicas] == [READY] * count


@pytest.mark.timeout(120)
async def test_a_rolling_restart_with_sigterm_loses_no_call(
    urls: list[str], served: list[Served]
) -> None:
    async with loaded(urls) as (client, load):
        for index, url in enumerate(urls):
            served[index].process.send_signal(signal.SIGTERM)
            assert await trio.to_thread.run_sync(served[index].process.wait, 20) == 0
            served[index].__exit__()
            await wait_for(functools.partial(not_ready, client, index))
            served[index] = serve(url)
            await trio.to_thread.run_sync(served[index].url)
            await wait_for(lambda: all_ready(client), within=READY_WITHIN)
            back = trio.current_time()
            await wait_for(functools.partial(load.answered_since_at_least, back, 200))
    assert [repr(exc) for _, exc in load.failed] == []
    assert len(load.answered) >= 800


@pytest.mark.timeout(60)
async def test_a_replica_killed_fails_only_its_calls_in_flight(
    urls: list[str], served: list[Served]
) -> None:
    async with loaded(urls) as (client, load):
        killed_at = trio.current_time()
        served[1].process.kill()
        await wait_for(lambda: client.replicas[1].state == LOST)
        await wait_for(functools.partial(load.answered_since_at_least, killed_at + 1.0, 200))
        assert [r.state for r in client.replicas] == [READY, LOST, READY]
    # each caller has one call in flight: at most that many were on the killed one
    assert len(load.failed) <= CALLERS
    assert all(isinstance(exc, ConnectionLostError) for _, exc in load.failed)
    assert all(started < killed_at + 1.0 for started, _ in load.failed)


@pytest.mark.timeout(60)
async def test_a_stopped_replica_is_left_once_silent_past_the_idle_timeout(
    urls: list[str], served: list[Served]
) -> None:
    async with connect(urls[:2], timeout=30, idle_timeout=2) as client:
        await wait_for(lambda: all_ready_of(client, 2))
        echo = await client.service("echo")
        served[0].process.send_signal(signal.SIGSTOP)  # no heartbeat, no answer
        failed: list[BaseException] = []

        async def call() -> None:
            try:
                assert await echo.echo("x") == "x"
            except ConnectionLostError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(4):  # some go to the stopped one: nothing says it stopped
                nursery.start_soon(call)
        assert 0 < len(failed) < 4  # failed once the idle timeout passed, not before
        await wait_for(lambda: client.replicas[0].state == LOST)
        assert [await echo.echo(n) for n in range(10)] == list(range(10))


@pytest.mark.timeout(60)
async def test_a_stopped_replica_gets_no_new_calls_once_its_health_check_goes_unanswered(
    urls: list[str], served: list[Served]
) -> None:
    """With the default idle timeout (60 s), the health check finds a stopped replica first:
    unanswered for HEALTH_TIMEOUT, it takes no new calls; answering again, it is used again."""
    async with connect(urls[:2], timeout=30) as client:
        await wait_for(lambda: all_ready_of(client, 2))
        echo = await client.service("echo")
        served[0].process.send_signal(signal.SIGSTOP)
        try:
            await wait_for(lambda: client.replicas[0].state == LOST, within=HEALTH_TIMEOUT + 5)
            assert [await echo.echo(n) for n in range(20)] == list(range(20))
            assert client.replicas[0].in_flight == 0  # none of them went to the stopped one
        finally:
            served[0].process.send_signal(signal.SIGCONT)
        await wait_for(lambda: all_ready_of(client, 2), within=HEALTH_TIMEOUT + 5)
