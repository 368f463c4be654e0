"""Reply idioms other stacks use, with a real Qpid Proton ``BlockingConnection`` as the caller
(issue 25): Proton's ``SyncRequestResponse`` (a correlation-id, no message-id), a reply-to that
names the receiving link rather than an address (@azure/core-amqp's ``$cbs`` link, Erlang's
amqp10_client), and a request without reply-to (azure-eventhub's put-token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from proton import Delivery, Message
from proton.utils import BlockingConnection, SyncRequestResponse

from pairlink import open_server
from pairlink._amqp import errors
from pairlink._rpc import wire
from pairlink._server.serving import Server
from services.echo import Echo
from tests.interop.proton_peers import open_blocking

TIMEOUT = 10.0


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


def echo_request(value: str, **fields: Any) -> Message:
    """An echo request as a Proton user writes it: the arguments as an amqp-value list."""
    return Message(body=[value], properties={wire.OPERATION: "echo"}, **fields)


def answered(reply: Message) -> tuple[Any, Any]:
    props: Any = reply.properties  # Proton's annotations say None here
    return props[wire.STATUS_CODE], reply.body


async def in_thread(url: str, job: Any) -> Any:
    """Run ``job(connection)`` on a Proton ``BlockingConnection`` to ``url`` in a thread."""

    def run() -> Any:
        conn = open_blocking(url, timeout=TIMEOUT)
        try:
            return job(conn)
        finally:
            conn.close()

    return await trio.to_thread.run_sync(run)


async def test_sync_request_response_gets_answers(server: Server) -> None:
    """Its requests carry only a correlation-id: each reply carries that correlation-id."""

    def job(conn: BlockingConnection) -> list[tuple[Any, Any, Any]]:
        rpc = SyncRequestResponse(conn, "echo")
        out = []
        for i in range(3):
            request = echo_request(f"sync {i}")
            reply = rpc.call(request)
            assert request.id is None  # (what makes this idiom: no message-id at all)
            out.append((reply.correlation_id, request.correlation_id, answered(reply)))
        refused = Message(body=[], properties={wire.OPERATION: "nope"})  # an error reply too
        reply = rpc.call(refused)
        out.append((reply.correlation_id, refused.correlation_id, answered(reply)))
        return out

    *calls, (got, sent, (status, _)) = await in_thread(server.url, job)
    assert (got, status) == (sent, wire.NOT_FOUND)
    for i, (got, sent, answer) in enumerate(calls):
        assert got == sent
        assert answer == (200, f"sync {i}")


async def test_reply_to_naming_a_receiving_link_without_target(server: Server) -> None:
    """A sender to the service, and a receiving link *named* X from it with no target
    address; requests with reply-to X are answered on that link."""

    def job(conn: BlockingConnection) -> list[Message]:
        receiver = conn.create_receiver("echo", credit=5, name="cbs-replies-7")
        assert receiver.link.target.address is None
        sender = conn.create_sender("echo")
        replies = []
        for i in range(3):
            sender.send(echo_request(f"named {i}", id=f"n-{i}", reply_to="cbs-replies-7"))
            replies.append(receiver.receive(timeout=TIMEOUT))
            receiver.accept()
        return replies

    replies = await in_thread(server.url, job)
    assert [r.correlation_id for r in replies] == ["n-0", "n-1", "n-2"]
    assert [answered(r) for r in replies] == [(200, f"named {i}") for i in range(3)]


async def test_no_reply_to_goes_to_the_one_receiving_link_from_the_service(
    server: Server,
) -> None:
    def job(conn: BlockingConnection) -> Message:
        receiver = conn.create_receiver("echo", credit=5, name="management-replies")
        sender = conn.create_sender("echo")
        sender.send(echo_request("put-token", id="t-1"))  # raises unless accepted
        reply = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
        return reply

    reply = await in_thread(server.url, job)
    assert reply.correlation_id == "t-1"
    assert answered(reply) == (200, "put-token")


async def test_no_reply_to_with_two_receiving_links_from_the_service_is_refused(
    server: Server,
) -> None:
    """Which link is its is ambiguous: rejected with the reason, and no reply on either."""

    def job(conn: BlockingConnection) -> tuple[Any, Any, Any, list[Any]]:
        links = [conn.create_receiver("echo", credit=5, name=f"replies-{i}") for i in (1, 2)]
        sender = conn.create_sender("echo")
        delivery = sender.send(echo_request("put-token", id="t-2"), error_states=[])
        condition: Any = delivery.remote.condition
        # a named reply-to on the same connection is still answered, on the link named
        sender.send(echo_request("after", id="t-3", reply_to="replies-2"))
        after = links[1].receive(timeout=TIMEOUT)
        links[1].accept()
        queued = [link.link.queued for link in links]
        return (
            delivery.remote_state,
            condition.name,
            condition.description,
            [
                after.correlation_id,
                *queued,
            ],
        )

    state, name, description, (after, left_1, left_2) = await in_thread(server.url, job)
    assert state == Delivery.REJECTED
    assert name == errors.INVALID_FIELD
    assert "no reply-to" in description and "2 receiving links" in description
    assert (after, left_1, left_2) == ("t-3", 0, 0)  # nothing else came on either link
