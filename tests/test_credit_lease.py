"""Credit is a lease (issue 22): a caller whose request link takes credit and neither uses it
nor gives it back when drained loses it ``drain_timeout`` seconds later, detached with
``amqp:resource-limit-exceeded``, so that its slots serve the callers it kept waiting.

Hostile callers are bare engines over real TCP to a real server; the normal caller is our own
client. Time is the ``io_clock``'s (it jumps only while every socket is idle), so the
default ``drain_timeout`` is tested as it ships, without waiting for it.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio
from structlog.testing import capture_logs

from pairlink import (
    Client,
    ConfigError,
    Limits,
    LinkDetachedError,
    PairlinkError,
    RemoteError,
    connect,
    handler,
    open_server,
    service,
)
from pairlink._amqp.errors import DETACH_FORCED, RESOURCE_LIMIT_EXCEEDED
from pairlink._amqp.link import Link
from pairlink._amqp.performatives import Detach
from pairlink._config.limits import DRAIN_TIMEOUT
from pairlink._server.config import parse_serve_config
from pairlink._server.mailbox import RESERVE_DIVISOR, STARVED_AFTER
from pairlink._server.service import DEFAULT_MAILBOX
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, wait_for

URL = "amqp://127.0.0.1:0"


@service("work")
class Work:
    @handler
    def ping(self) -> str:
        return "pong"


async def hold_credit(
    stack: AsyncExitStack, server: Server, n: int
) -> list[tuple[RawClient, Link]]:
    """``n`` callers, each on its own connection with one request link, which take whatever
    credit they are given and never send, nor answer a drain."""
    held = []
    for i in range(n):
        hog = await stack.enter_async_context(raw_client(server.url))
        link, _ = hog.pair("work", f"hog-{i}")
        await hog.wait_attached(link)
        held.append((hog, link))
    return held


def detaches(hog: RawClient, link: Link) -> list[Detach]:
    return hog.of(Detach, handle=link.remote_handle)


@pytest.mark.parametrize("hoarders", [5, 50])
async def test_credit_never_used_nor_given_back_is_revoked_and_the_next_caller_is_served(
    hoarders: int, io_clock: trio.testing.MockClock
) -> None:
    async with (
        open_server(Work, listen=URL) as server,
        AsyncExitStack() as stack,
    ):
        held = await hold_credit(stack, server, hoarders)
        first, first_link = held[0]
        # the first took all but the reserve, the next ones the reserve: nothing is free
        assert first_link.link_credit == DEFAULT_MAILBOX - DEFAULT_MAILBOX // RESERVE_DIVISOR
        mailbox = server.actors["work"].mailbox
        assert mailbox.free == 0
        async with connect(server.url, timeout=60) as client:
            started = trio.current_time()
            with trio.fail_after(DRAIN_TIMEOUT + 1):
                assert await client.call("work", "ping") == "pong"
            assert trio.current_time() - started >= DRAIN_TIMEOUT  # it did have to wait
        await first.read_until(lambda: bool(detaches(first, first_link)))
        (detach,) = detaches(first, first_link)
        assert detach.closed
        assert detach.error is not None
        assert detach.error.condition == RESOURCE_LIMIT_EXCEEDED
        assert f"did not answer a drain within {DRAIN_TIMEOUT:g} s" in (
            detach.error.description or ""
        )
        assert mailbox.revoked >= 1
        assert mailbox.outstanding + mailbox.held <= mailbox.bound


async def test_a_link_that_answers_its_drain_keeps_it(io_clock: trio.testing.MockClock) -> None:
    """Draining is not revoking: the caller that gives its credit back in time keeps its link
    and gets its share again, however long it then waits."""
    async with (
        open_server(Work, listen=URL, limits=Limits(drain_timeout=2.0)) as server,
        raw_client(server.url) as honest,
    ):
        link, _ = honest.pair("work", "honest")
        await honest.read_until(lambda: link.link_credit > 0)
        async with connect(server.url, timeout=60) as client:
            call = trio.Event()

            async def ping() -> None:
                assert await client.call("work", "ping") == "pong"
                call.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping)
                await honest.read_until(lambda: link.drain)
                honest.engine.complete_drain(link)  # nothing to send: all of it goes back
                await honest.flush()
                await call.wait()
        await trio.sleep(3 * 2.0)  # (mock time) long past the drain timeout
        await honest.read_until(lambda: link.link_credit > 0 and not link.drain)
        assert detaches(honest, link) == []
        assert server.actors["work"].mailbox.revoked == 0


def test_drain_timeout_is_read_from_the_limits_table_and_checked() -> None:
    config = parse_serve_config("[limits]\ndrain_timeout = 1.5\n")
    assert config.limits == Limits(drain_timeout=1.5)
    with pytest.raises(ConfigError, match=r"limits\.drain_timeout"):
        parse_serve_config('[limits]\ndrain_timeout = "soon"\n')


@service("busy", max_concurrency=1, mailbox=1)
class Busy:
    @handler
    async def hold(self) -> None:
        await trio.sleep_forever()


async def test_a_service_whose_callers_wait_for_credit_says_so_and_names_the_holders(
    io_clock: trio.testing.MockClock,
) -> None:
    with capture_logs() as logs:
        async with (
            open_server(Busy, listen=URL) as server,
            connect(server.url, timeout=600) as holder,
            connect(server.url, timeout=600) as waiting,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(holder.call, "busy", "hold")  # the one slot, while it runs
            await wait_for(lambda: server.actors["busy"].held == 1)
            nursery.start_soon(waiting.call, "busy", "hold")  # no credit for this one
            report = await waiting.call("$health", "check", service="busy")
            assert report == {"status": "serving"}
            await trio.sleep(STARVED_AFTER + 1)
            report = await waiting.call("$health", "check", service="busy")
            assert report["status"] == "serving"
            assert report["waiting_for_credit"] >= STARVED_AFTER
            (holder_line,) = report["credit_holders"]
            assert holder_line.endswith(": 1 calls, 0 credit")
            assert "user anonymous" in holder_line
            nursery.cancel_scope.cancel()  # (the calls are the test's means, not its subject)
    (starved,) = [entry for entry in logs if entry["event"] == "credit.starved"]
    assert starved["holders"] == [holder_line]


async def test_a_call_still_waiting_for_credit_when_the_server_stops_says_so(
    io_clock: trio.testing.MockClock,
) -> None:
    """A graceful stop answers every call held; one that never got credit fails with the
    condition and text of the stop, not a bare detach (issue 22)."""
    outcome: list[BaseException] = []
    both = trio.Event()

    async def call_and_keep_error(client: Client) -> None:
        try:
            await client.call("busy", "hold")
        except PairlinkError as exc:
            outcome.append(exc)
        if len(outcome) == 2:
            both.set()

    async with (
        open_server(Busy, listen=URL, grace=1.0) as server,
        connect(server.url, timeout=600) as holder,
        connect(server.url, timeout=600, reconnect=False) as waiting,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(call_and_keep_error, holder)
        await wait_for(lambda: server.actors["busy"].held == 1)
        nursery.start_soon(call_and_keep_error, waiting)
        await wait_for(lambda: server.actors["busy"].mailbox.starved(1e9) is not None)
        server.stop()
        with trio.fail_after(30):
            await both.wait()
    held, waited = outcome
    assert isinstance(held, RemoteError) and held.status == 503  # cut short by the stop
    assert isinstance(waited, LinkDetachedError)
    assert waited.condition == DETACH_FORCED
    assert waited.description == "the server is shutting down"
