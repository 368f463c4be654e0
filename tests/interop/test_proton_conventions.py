"""Issue 11 against Apache Qpid Proton, both ways round, over real TCP on 127.0.0.1.

* A Proton ``BlockingConnection`` client doing the textbook request-response: unsettled
  requests, a dynamic receiver in the default (mixed) settle mode, ``receive()`` then
  ``accept()``. A pre-settled reply leaves Proton nothing to accept (``IndexError: pop from an
  empty deque``): in mixed mode a reply must mirror its request's settlement.
* Our client against a Proton server written like Proton's C++ example server: it reads the
  body as a string, answers it upper-cased, and copies the request's *correlation-id*; and
  against one that types its answers as rhea does (uint results and statuses).
* Proton clients sending our service bare amqp-values: one argument is the value itself, the
  handler sees plain Python values, and the status-code is an AMQP int.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from proton import Message, int32, symbol, uint
from proton.reactor import LinkOption
from proton.utils import BlockingConnection

from pairlink import RemoteError, connect, handler, open_server, service
from pairlink._rpc import wire
from pairlink._server.serving import Server
from services.echo import Echo
from tests.interop.proton_peers import ProtonServer, open_blocking, run_client


@service("kinds")
class Kinds:
    """Tells what its argument arrived as."""

    @handler
    def kind(self, value: Any) -> list[Any]:
        return [type(value).__name__, value]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Echo, Kinds, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


def property_of(message: Message, key: str) -> Any:
    props: Any = message.properties  # Proton's annotations say None here
    return props[key]


def status_of(reply: Message) -> Any:
    return property_of(reply, wire.STATUS_CODE)


# -- a Proton BlockingConnection client: receive() then accept() ---------------------------------


class _Target(LinkOption):
    """A Proton ``LinkOption``: the receiver's own target address (the AMQP management pattern:
    replies go to the link whose target the request's ``reply-to`` names)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: Any) -> None:
        link.target.address = self.address

    def test(self, link: Any) -> bool:
        return True


def blocking_requests(url: str, count: int, *, dynamic: bool) -> list[tuple[Any, Any, Any]]:
    """The textbook Proton client: a receiver in the default (mixed) settle mode, unsettled
    requests (``BlockingSender.send`` waits for each outcome), each reply ``receive()``d then
    ``accept()``ed. Returns (correlation-id, body, status) per reply."""
    conn: BlockingConnection = open_blocking(url, timeout=10)
    try:
        if dynamic:
            receiver = conn.create_receiver(None, dynamic=True, credit=count)
            reply_to = receiver.link.remote_source.address
        else:
            reply_to = "proton-replies"
            receiver = conn.create_receiver("echo", credit=count, options=_Target(reply_to))
        sender = conn.create_sender("echo")
        replies = []
        for i in range(count):
            request = Message(
                id=f"b-{i}", reply_to=reply_to, body=f"hi {i}", properties={"operation": "echo"}
            )
            sender.send(request)  # unsettled: blocks until the service settles it
            reply = receiver.receive(timeout=10)
            receiver.accept()  # Proton pops the reply's delivery: there must be one
            replies.append((reply.correlation_id, reply.body, status_of(reply)))
        return replies
    finally:
        conn.close()


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "management"])
async def test_a_proton_blocking_client_receives_then_accepts_each_reply(
    server: Server, dynamic: bool
) -> None:
    replies = await trio.to_thread.run_sync(
        functools.partial(blocking_requests, server.url, 5, dynamic=dynamic)
    )
    assert replies == [(f"b-{i}", f"hi {i}", 200) for i in range(5)]


# -- our client against Proton servers of other conventions ----------------------------------------


def like_the_cpp_example(request: Message) -> Message:
    """Proton's C++ example server: the body must be a string (it aborts otherwise); the
    reply is upper-cased, with the request's correlation-id (not its message-id) and no
    status at all."""
    body = request.body
    if not isinstance(body, str):
        return Message(body=f"want: string got: {type(body).__name__}", correlation_id="none")
    correlation = request.correlation_id if request.correlation_id is not None else "none"
    return Message(body=body.upper(), correlation_id=correlation)


async def test_our_client_against_a_server_like_protons_cpp_example() -> None:
    with ProtonServer(responder=like_the_cpp_example) as px:
        async with connect(px.url(), timeout=10) as client:
            assert await client.call("examples", "upper", "hello") == "HELLO"
            with pytest.raises(TimeoutError):  # several arguments are a list: no string
                await client.call("examples", "upper", "a", "b", timeout=1)
        received = [r.message for r in px.received]
    assert [m.body for m in received] == ["hello", ["a", "b"]]
    assert all(m.correlation_id == m.id for m in received)  # both, the same


def record_only(request: Message) -> Message:
    return Message(body=None, properties={wire.STATUS_CODE: 200})


async def test_bodies_a_foreign_server_gets_for_no_argument_and_for_keywords() -> None:
    with ProtonServer(responder=record_only) as px:
        async with connect(px.url(), timeout=10) as client:
            assert await client.call("svc", "ping") is None
            assert await client.call("svc", "find", name="x", limit=2) is None
            assert await client.call("svc", "sum", [1, 2]) is None
        received = [r.message for r in px.received]
    assert [m.body for m in received] == [None, {"name": "x", "limit": 2}, [[1, 2]]]
    assert [property_of(m, "operation") for m in received] == ["ping", "find", "sum"]


def typed_like_rhea(request: Message) -> Message:
    """Answers as a rhea service does by default: every number a uint (result and status)."""
    operation = property_of(request, "operation")
    if operation == "add":
        body: Any = request.body
        return Message(body=uint(sum(body)), properties={wire.STATUS_CODE: uint(200)})
    if operation == "all":
        return Message(body={symbol("n"): [uint(1), int32(-2)]}, properties={"status-code": 200})
    return Message(
        properties={
            wire.STATUS_CODE: uint(404),
            wire.STATUS_DESCRIPTION: symbol("no such operation"),
        }
    )


async def test_results_and_errors_from_a_typed_server_are_plain_python_values() -> None:
    with ProtonServer(responder=typed_like_rhea) as px:
        async with connect(px.url(), timeout=10) as client:
            total = await client.call("calc", "add", 1, 2)
            assert total == 3 and type(total) is int
            everything = await client.call("calc", "all")
            assert everything == {"n": [1, -2]}
            assert [type(k) for k in everything] == [str]
            assert [type(v) for v in everything["n"]] == [int, int]
            with pytest.raises(RemoteError) as caught:
                await client.call("calc", "nope")
    assert type(caught.value.status) is int
    assert str(caught.value) == "[404] no such operation"


async def test_map_to_a_proton_server_sends_each_row_as_a_call_of_its_own() -> None:
    """A peer of another stack reads no batch: ``map`` calls it a row at a time, each an
    amqp-value it understands, the results in order."""
    with ProtonServer(responder=typed_like_rhea) as px:
        async with connect(px.url(), timeout=10) as client:
            calc = await client.service("calc")
            assert await calc.map("add", [1, 2, 3], [10, 20, 30]) == [11, 22, 33]
            (missing,) = await calc.map("nope", [1], on_error="return")
        received = [r.message for r in px.received]
    bodies: list[Any] = [m.body for m in received[:3]]
    assert sorted(bodies) == [[1, 10], [2, 20], [3, 30]]  # one call a row, each a plain list
    assert isinstance(missing, RemoteError) and missing.status == 404


# -- Proton clients sending our service bare values ------------------------------------------------


async def test_a_proton_client_sends_our_service_bare_amqp_values(server: Server) -> None:
    requests = [
        Message(id="s", reply_to="$me", body="hello", properties={"operation": "echo"}),
        Message(id="u", reply_to="$me", body=uint(7), properties={"operation": "kind"}),
        Message(id="y", reply_to="$me", body=symbol("sym"), properties={"operation": "kind"}),
        Message(id="n", reply_to="$me", body=None, properties={"operation": "kind"}),
    ]
    kinds = [m for m in requests if property_of(m, "operation") == "kind"]
    echo = [m for m in requests if property_of(m, "operation") == "echo"]
    results = {}
    for address, batch in (("echo", echo), ("kinds", kinds)):
        result = await trio.to_thread.run_sync(
            functools.partial(
                run_client,
                server.url,
                send_to=address,
                receive_from=address,
                link_name=f"conventions-{address}",
                link_properties={"paired": True},
                messages=batch,
                expect=len(batch),
                timeout=10,
            )
        )
        assert result.error is None
        results.update({m.correlation_id: m for m in result.received})
    assert results["s"].body == "hello"
    assert results["u"].body == ["int", 7]  # the handler got a plain int, not a uint
    assert results["y"].body == ["str", "sym"]
    assert status_of(results["n"]) == 400  # no argument for a handler that needs one
    for reply in results.values():
        assert type(status_of(reply)) is int32  # an AMQP int, as the management convention has
