"""A handler's view of its call (``pairlink.current_call``), over real TCP: what it reads is
what the caller sent and who the caller is, for ``async def``, inline and thread-run ``def``
handlers alike; what it adds to ``reply_properties`` reaches the caller beside the status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from pairlink import CallContext, Reply, connect, current_call, handler, open_server, service
from pairlink._rpc import deadline, wire
from pairlink.errors import CallError


def _seen(*, fail: bool = False) -> dict[str, Any]:
    """What the handler reads of its call; it also answers with a property of its own, and
    tries to override the status (which must not work)."""
    call = current_call()
    assert isinstance(call, CallContext)
    assert call is current_call()  # one context for the whole call
    call.reply_properties["seen-by"] = "handler"
    call.reply_properties[wire.STATUS_CODE] = 999
    if fail:
        raise CallError(409, "conflict")
    return {
        "message_id": call.message_id,
        "user": call.user,
        "via": list(call.via),
        "container_id": call.container_id,
        "peer": call.peer,
        "deadline": call.deadline,
        "tenant": call.application_properties.get("tenant"),
        "operation": call.application_properties.get(wire.OPERATION),
    }


@service("ctx")
class Ctx:
    @handler
    async def in_task(self) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return _seen()

    @handler(inline=True)
    def inline(self) -> dict[str, Any]:
        return _seen()

    @handler
    def in_thread(self) -> dict[str, Any]:
        return _seen()

    @handler
    async def refuses(self) -> None:
        _seen(fail=True)

    @handler
    async def silent(self) -> str:
        return "plain"


@pytest.mark.parametrize("operation", ["in_task", "inline", "in_thread"])
async def test_each_kind_of_handler_sees_its_call(operation: str) -> None:
    async with (
        open_server(Ctx(), listen="amqp://127.0.0.1:0", users={"alice": "secret"}) as server,
        connect(
            server.url.replace("amqp://", "amqp://alice:secret@"), container_id="caller-7"
        ) as client,
    ):
        before = deadline.wall_time()
        reply: Reply = await client.request(
            "ctx",
            [],
            application_properties={wire.OPERATION: operation, "tenant": "t1"},
            message_id="m-42",
            timeout=20,
        )
    assert reply.message is not None
    app = reply.message.application_properties or {}
    assert app[wire.STATUS_CODE] == wire.OK, app
    assert app["seen-by"] == "handler"
    seen = wire.parse_reply(reply.message)
    assert seen["message_id"] == "m-42"
    assert (seen["user"], seen["via"]) == ("alice", [])  # a direct call: no gateway vouched
    assert seen["container_id"] == "caller-7"
    assert seen["peer"].startswith("127.0.0.1:")
    assert before + 19 < seen["deadline"] <= deadline.wall_time() + 20
    assert (seen["tenant"], seen["operation"]) == ("t1", operation)


@pytest.mark.parametrize("operation", ["in_task", "inline", "in_thread"])
async def test_a_call_read_without_its_message_shows_the_same_call(
    operation: str, fast_reads: Callable[[str], list[bool]]
) -> None:
    """A call as our client sends it is read without building its message
    (``wire.read_request``): the handler still sees its message-id, deadline, caller and the
    operation's application-properties."""
    read = fast_reads("request")
    async with (
        open_server(Ctx(), listen="amqp://127.0.0.1:0") as server,
        connect(server.url, container_id="caller-8") as client,
    ):
        before = deadline.wall_time()
        seen = await client.call("ctx", operation, timeout=20, message_id="m-43")
    assert read == [True]
    assert seen["message_id"] == "m-43"
    assert (seen["user"], seen["container_id"]) == ("anonymous", "caller-8")
    assert before + 19 < seen["deadline"] <= deadline.wall_time() + 20
    assert (seen["tenant"], seen["operation"]) == (None, operation)


async def test_reply_properties_go_with_an_error_reply_too() -> None:
    async with (
        open_server(Ctx(), listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        reply = await client.request("ctx", [], application_properties={wire.OPERATION: "refuses"})
    assert reply.message is not None
    app = reply.message.application_properties or {}
    assert (app[wire.STATUS_CODE], app[wire.STATUS_DESCRIPTION]) == (409, "conflict")
    assert app["seen-by"] == "handler"


async def test_a_handler_that_sets_none_gets_the_plain_reply() -> None:
    async with (
        open_server(Ctx(), listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        reply = await client.request("ctx", [], application_properties={wire.OPERATION: "silent"})
    assert reply.message is not None
    assert reply.message.application_properties == {
        wire.STATUS_CODE: wire.OK,
        wire.STATUS_DESCRIPTION: "OK",
    }


def test_outside_a_call_it_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match="only available while a handler serves a call"):
        current_call()
