"""Middleware around each call (issue 12 §6), over real TCP on 127.0.0.1: authorisation by
SASL user, server-wide outside the service's own in list order, around every kind of handler
(the middleware on the event loop, a ``def`` handler in its thread), failures answered as a
handler's are; and a deduplicated repeat gets the first answer's reply properties."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pairlink import (
    CallContext,
    CallError,
    Client,
    Middleware,
    Proceed,
    RemoteError,
    connect,
    current_call,
    handler,
    hosted,
    open_server,
    service,
)
from pairlink._rpc import wire

USERS = {"alice": "alice-pw", "bob": "bob-pw"}


async def only_alice(call: CallContext, proceed: Proceed) -> Any:
    """Authorisation by the caller's SASL identity."""
    if call.user != "alice":
        raise CallError(403, f"{call.user} may not call {call.service}.{call.operation}")
    return await proceed()


def recorder(name: str, log: list[str]) -> Middleware:
    """A middleware that notes when it enters and leaves, and tags the value it passes on."""

    async def record(call: CallContext, proceed: Proceed) -> Any:
        log.append(f"{name}>")
        value = await proceed()
        log.append(f"<{name}")
        return [*value, name] if isinstance(value, list) else value

    return record


@service("vault", middleware=[only_alice])
class Vault:
    @handler
    async def secret(self) -> str:
        return "the secret"


@service("kinds")
class Kinds:
    """The same answer from each kind of handler: where it ran, and what it saw."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def _seen(self, kind: str) -> list[Any]:
        call = current_call()
        self.log.append("handler")
        return [kind, call.service, call.operation, threading.get_ident()]

    @handler
    async def in_task(self) -> list[Any]:
        return self._seen("async")

    @handler
    def in_thread(self) -> list[Any]:
        return self._seen("thread")

    @handler(inline=True)
    def inline(self) -> list[Any]:
        return self._seen("inline")


@asynccontextmanager
async def serving(*services: object, **options: Any) -> AsyncIterator[str]:
    async with open_server(*services, listen="amqp://127.0.0.1:0", **options) as server:
        yield server.url


def as_user(url: str, user: str) -> str:
    return url.replace("amqp://", f"amqp://{user}:{USERS[user]}@")


async def test_authorisation_by_sasl_user() -> None:
    async with serving(Vault, users=USERS) as url:
        async with connect(as_user(url, "alice")) as alice:
            assert await alice.call("vault", "secret") == "the secret"
        async with connect(as_user(url, "bob")) as bob:
            with pytest.raises(RemoteError) as refused:
                await bob.call("vault", "secret")
    assert refused.value.status == 403
    assert refused.value.message == "bob may not call vault.secret"


LOG: list[str] = []
ON_LOOP: list[int] = []


async def on_the_loop(call: CallContext, proceed: Proceed) -> Any:
    trio.lowlevel.current_task()  # raises outside Trio: middleware runs on the event loop
    ON_LOOP.append(threading.get_ident())
    return await proceed()


@service(
    "layered", middleware=[recorder("service-1", LOG), recorder("service-2", LOG), on_the_loop]
)
class Layered(Kinds):
    """:class:`Kinds` with middleware of its own."""


@pytest.mark.parametrize("operation", ["in_task", "in_thread", "inline"])
async def test_server_wide_middleware_runs_outside_the_services_in_list_order(
    operation: str,
) -> None:
    LOG.clear()
    ON_LOOP.clear()
    layered = Layered()
    layered.log = LOG
    outer = [recorder("server-1", LOG), recorder("server-2", LOG)]
    async with (
        serving(hosted(layered, address="here"), middleware=outer) as url,
        connect(url) as client,
    ):
        value = await client.call("here", operation)
    assert LOG == [
        "server-1>", "server-2>", "service-1>", "service-2>", "handler",
        "<service-2", "<service-1", "<server-2", "<server-1",
    ]  # fmt: skip
    kind, seen_service, seen_operation, handler_thread, *tags = value
    assert tags == ["service-2", "service-1", "server-2", "server-1"]  # innermost first
    assert (seen_service, seen_operation) == ("here", operation)
    assert [threading.get_ident()] == ON_LOOP
    if kind == "thread":
        assert handler_thread != threading.get_ident()  # its own thread, as without middleware
    else:
        assert handler_thread == threading.get_ident()


async def test_the_context_names_the_service_and_operation() -> None:
    seen: list[tuple[str, str, Any]] = []

    async def note(call: CallContext, proceed: Proceed) -> Any:
        seen.append((call.service, call.operation, call.message_id))
        assert current_call() is call  # the handler's context, the same object
        return await proceed()

    async with serving(hosted(Kinds, address="k2"), middleware=[note]) as url, connect(url) as c:
        await c.call("k2", "in_task", message_id="m-1")
    assert seen == [("k2", "in_task", "m-1")]


async def test_a_middleware_failure_is_an_undisclosed_500() -> None:
    async def broken(call: CallContext, proceed: Proceed) -> Any:
        raise RuntimeError("password=hunter2")

    async with serving(Kinds, middleware=[broken]) as url, connect(url) as client:
        with pytest.raises(RemoteError) as failed:
            await client.call("kinds", "inline")
    assert failed.value.status == 500
    assert failed.value.ref is not None
    assert failed.value.message == f"internal error (ref {failed.value.ref})"
    assert "hunter2" not in str(failed.value)


async def test_a_middleware_may_answer_without_the_handler() -> None:
    handled: list[str] = []
    kinds = Kinds()
    kinds.log = handled

    async def cached(call: CallContext, proceed: Proceed) -> Any:
        return "from the cache"

    async with serving(kinds, middleware=[cached]) as url, connect(url) as client:
        assert await client.call("kinds", "in_thread") == "from the cache"
    assert handled == []


async def test_middleware_around_a_call_cut_short_by_its_deadline() -> None:
    finished: list[str] = []

    @service("sleepy")
    class Sleepy:
        @handler
        async def nap(self) -> None:
            await trio.sleep_forever()

    async def timing(call: CallContext, proceed: Proceed) -> Any:
        try:
            return await proceed()
        finally:
            finished.append(call.operation)

    async with serving(Sleepy, middleware=[timing]) as url, connect(url) as client:
        with pytest.raises(TimeoutError):
            await client.call("sleepy", "nap", timeout=0.2)
    assert finished == ["nap"]


def test_middleware_must_be_callables() -> None:
    with pytest.raises(TypeError, match=r"@service\('x'\): middleware must be async callables"):
        service("x", middleware=["not callable"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="middleware takes a list"):
        service("x", middleware=only_alice)  # type: ignore[arg-type]


# -- a repeat's reply properties (dedup) --------------------------------------------------------


@service("counter", dedup_window=60)
class Counter:
    def __init__(self) -> None:
        self.runs = 0

    @handler
    async def bump(self) -> int:
        self.runs += 1
        current_call().reply_properties["run"] = self.runs
        return self.runs


async def _bump(client: Client, key: str) -> tuple[Any, dict[Any, Any]]:
    reply = await client.request(
        "counter", [], application_properties={wire.OPERATION: "bump"}, message_id=key
    )
    assert reply.message is not None
    return wire.parse_reply(reply.message), reply.application_properties


async def test_a_repeat_gets_the_reply_properties_of_the_first_answer() -> None:
    counter = Counter()
    async with serving(counter) as url, connect(url) as client:
        first = await _bump(client, "key-1")
        again = await _bump(client, "key-1")
    assert counter.runs == 1
    assert first[0] == again[0] == 1
    assert first[1]["run"] == again[1]["run"] == 1
    assert again[1] == first[1]
