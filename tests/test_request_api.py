"""``Client.request``: messages of the caller's making, whole replies, over real TCP.

The peer is a small AMQP node written here on ``pairlink._io`` (``listen`` plus the link
API), answering paired links the way RabbitMQ 4 does: both halves named alike with
``paired: true``, pre-settled. One way of answering is RabbitMQ's ``/management`` node (HTTP
over AMQP, v2: the method in ``subject``, the percent-encoded path in ``to``, an
``amqp-value`` body; the status in the reply's ``subject``), against which the example
``examples/rabbitmq_management.py`` runs; the others echo what came, so a test can see both
what arrived and what came back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import pytest
import trio

from examples import rabbitmq_management as rabbit
from pairlink import RemoteError, Reply, connect
from pairlink._amqp import errors
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import (
    Accepted,
    Error,
    Header,
    Message,
    Outcome,
    Properties,
    Rejected,
)
from pairlink._amqp.performatives import SND_SETTLED, SND_UNSETTLED
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import Receiver, Sender, accept_receiver, accept_sender
from pairlink._io.listener import listen
from pairlink._rpc import wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, PAIRED
from tests.listening import EachLink

Respond = Callable[[Message], Message | None]


class Node:
    """An AMQP node that answers every request on the paired link it came by (``reply-to:
    $me``), as ``respond`` says (None: no answer), after settling an unsettled one with
    ``outcome`` (default: accepted; a request not accepted gets no answer). It keeps the
    peer's links (as attached) and every request."""

    def __init__(
        self,
        nursery: trio.Nursery,
        respond: Respond,
        outcome: Callable[[Message], Outcome] = lambda _request: Accepted(),
    ) -> None:
        self.nursery = nursery
        self.respond = respond
        self.outcome = outcome
        self.links: list[Link] = []
        self.requests: list[Message] = []
        self._repliers: dict[tuple[AmqpConnection, str], Sender] = {}

    def accept(self, conn: AmqpConnection) -> EachLink:
        return EachLink(conn, self.on_attach)

    def on_attach(self, conn: AmqpConnection, link: Link) -> None:
        self.links.append(link)
        properties = link.remote_properties  # paired: true comes back paired: true
        if link.is_receiver:  # the peer's requests
            receiver = accept_receiver(conn, link, credit=8, properties=properties)
            self.nursery.start_soon(self._serve, conn, link.name, receiver)
        else:  # the half that carries the replies
            self._repliers[conn, link.name] = accept_sender(conn, link, properties=properties)

    async def _serve(self, conn: AmqpConnection, name: str, receiver: Receiver) -> None:
        async for item in receiver:
            request = item.message
            self.requests.append(request)
            outcome = self.outcome(request)
            if not item.delivery.remote_settled:
                receiver.settle(item, outcome)
            assert request.properties is not None and request.properties.reply_to == wire.ME
            reply = self.respond(request) if isinstance(outcome, Accepted) else None
            if reply is not None:
                await self._repliers[conn, name].send(reply, wait=False)


def head(message: Message) -> Properties:
    assert message.properties is not None
    return message.properties


@asynccontextmanager
async def node_at(respond: Respond, **options: Any) -> AsyncIterator[tuple[str, Node]]:
    """A :class:`Node` listening on 127.0.0.1 (users ``guest``/``guest``, as RabbitMQ's
    default), offering link pairing; yields the URL to connect to, with the credentials."""
    async with trio.open_nursery() as nursery:
        node = Node(nursery, respond, **options)
        async with listen(
            "amqp://127.0.0.1:0",
            accept=node.accept,
            users={"guest": "guest"},
            offered_capabilities=[LINK_PAIR_V1_0],
        ) as listener:
            yield f"amqp://guest:guest@127.0.0.1:{listener.port}", node
        nursery.cancel_scope.cancel()


# -- RabbitMQ's /management node ---------------------------------------------------------------


class RabbitManagement:
    """Answers HTTP over AMQP as RabbitMQ 4's ``/management`` node does, for queues,
    exchanges and bindings: status code as a string in ``subject``, ``correlation-id`` = the
    request's message-id, ``http:response`` in application-properties, an ``amqp-value``
    body (a map, null, or an explanation string with an error status)."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.bindings: set[tuple[str, str, str]] = set()

    def __call__(self, request: Message) -> Message:
        props = request.properties
        assert props is not None and props.subject is not None and props.to is not None
        assert request.body_kind == "value"
        status, body = self.handle(props.subject, props.to, request.body)
        return Message(
            body=body,
            properties=Properties(subject=status, correlation_id=props.message_id),
            application_properties={"http:response": "1.1"},
        )

    def handle(self, method: str, target: str, body: Any) -> tuple[str, Any]:
        segments = target.split("/")[1:]
        match method, segments:
            case "GET", ["queues", name]:
                queue = self.queues.get(unquote(name))
                return (
                    ("404", f"queue '{unquote(name)}' not found")
                    if queue is None
                    else (
                        "200",
                        queue,
                    )
                )
            case "PUT", ["queues", name]:
                return self.declare_queue(unquote(name), body)
            case "DELETE", ["queues", name]:
                self.queues.pop(unquote(name), None)
                return "200", {"message_count": 0}
            case "PUT", ["exchanges", name]:
                assert set(body) <= {"type", "durable", "auto_delete", "internal", "arguments"}
                self.exchanges.setdefault(unquote(name), body)
                return "204", None
            case "DELETE", ["exchanges", name]:
                self.exchanges.pop(unquote(name), None)
                return "204", None
            case "POST", ["bindings"]:
                source, queue = body["source"], body["destination_queue"]
                if source not in self.exchanges or queue not in self.queues:
                    return "404", "no such exchange or queue"
                self.bindings.add((source, queue, body["binding_key"]))
                return "204", None
            case "DELETE", ["bindings", binding]:
                fields = dict(part.split("=", 1) for part in binding.split(";"))
                key = (unquote(fields["src"]), unquote(fields["dstq"]), unquote(fields["key"]))
                self.bindings.discard(key)
                return "204", None
        return "400", f"unsupported request {method} {target}"

    def declare_queue(self, name: str, body: Any) -> tuple[str, Any]:
        if not isinstance(body, dict) or not set(body) <= {
            "durable",
            "exclusive",
            "auto_delete",
            "arguments",
        }:
            return "400", f"bad queue properties {body!r}"
        arguments = body.get("arguments", {})
        declared = {
            "name": name,
            "vhost": "/",
            "durable": body.get("durable", True),
            "exclusive": body.get("exclusive", False),
            "auto_delete": body.get("auto_delete", False),
            "type": arguments.get("x-queue-type", "classic"),
            "arguments": arguments,
            "message_count": 0,
            "consumer_count": 0,
        }
        existing = self.queues.get(name)
        if existing is None:
            self.queues[name] = declared
            return "201", declared
        if existing["durable"] != declared["durable"]:
            return "409", f"inequivalent arg 'durable' for queue '{name}'"
        return "200", existing


async def test_the_rabbitmq_example_against_a_management_node() -> None:
    management = RabbitManagement()
    async with node_at(management) as (url, node), connect(url, timeout=5) as client:
        await rabbit.tour(client, "orders/eu 1")
    shapes = [(head(m).subject, head(m).to, m.body) for m in node.requests]
    queue = "/queues/orders%2Feu%201"  # the name is one path segment: its slash encoded too
    assert shapes == [
        (
            "PUT",
            queue,
            {
                "durable": True,
                "exclusive": False,
                "auto_delete": False,
                "arguments": {"x-queue-type": "classic"},
            },
        ),
        (
            "PUT",
            "/exchanges/pairlink.demo",
            {
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
            },
        ),
        (
            "POST",
            "/bindings",
            {
                "source": "pairlink.demo",
                "destination_queue": "orders/eu 1",
                "binding_key": "demo-key",
                "arguments": {},
            },
        ),
        ("GET", queue, None),
        ("DELETE", "/bindings/src=pairlink.demo;dstq=orders%2Feu%201;key=demo-key;args=", None),
        ("DELETE", "/exchanges/pairlink.demo", None),
        ("DELETE", queue, None),
        ("GET", queue, None),
    ]
    ids = [head(m).message_id for m in node.requests]
    assert len(set(ids)) == len(ids)  # each request its own message-id, matched by it
    assert all(head(m).reply_to == "$me" for m in node.requests)
    assert management.queues == {} and management.exchanges == {} and not management.bindings

    # one pair of links, as RabbitMQ requires: one name, paired: true, pre-settled, the
    # node's address on the far side and one client address on ours
    requests, replies = sorted(node.links, key=lambda link: link.is_receiver, reverse=True)
    assert requests.name == replies.name
    for link in (requests, replies):
        assert link.remote_properties == {PAIRED: True}
        assert link.remote_attach is not None
        assert link.remote_attach.snd_settle_mode == SND_SETTLED
    assert requests.remote_target is not None and requests.remote_target.address == "/management"
    assert replies.remote_source is not None and replies.remote_source.address == "/management"
    assert requests.remote_source is not None and replies.remote_target is not None
    assert requests.remote_source.address == replies.remote_target.address is not None


async def test_the_example_reads_each_status_as_rabbitmq_means_it() -> None:
    management = RabbitManagement()
    async with node_at(management) as (url, _node), connect(url, timeout=5) as client:
        assert await rabbit.get_queue(client, "q") is None  # 404
        created = await rabbit.declare_queue(client, "q", durable=False)  # 201
        assert created["name"] == "q" and created["durable"] is False
        assert await rabbit.declare_queue(client, "q", durable=False) == created  # 200
        with pytest.raises(rabbit.ManagementError) as exc:
            await rabbit.declare_queue(client, "q")  # durable now: 409
        assert exc.value.status == 409 and "inequivalent" in exc.value.explanation
        with pytest.raises(rabbit.ManagementError) as exc:
            await rabbit.bind(client, "missing", "q")
        assert exc.value.status == 404
        assert await rabbit.delete_queue(client, "q") == 0


async def test_the_example_says_when_no_broker_is_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await rabbit.main("amqp://guest:guest@127.0.0.1:1") == 1
    assert "no RabbitMQ broker answers at amqp://guest:guest@127.0.0.1:1" in capsys.readouterr().err


# -- Client.request ------------------------------------------------------------------------


def echo(request: Message) -> Message:
    """Everything back: the body as it came, the subject and application-properties, the
    request's correlation-id as the reply's (as Qpid Proton's example servers do)."""
    props = request.properties
    assert props is not None
    return Message(
        body=request.body,
        body_kind=request.body_kind,
        properties=Properties(
            correlation_id=props.correlation_id,
            subject=props.subject,
            content_type=props.content_type,
            to="$me",
        ),
        application_properties=request.application_properties,
    )


async def test_a_request_as_the_caller_made_it_and_the_whole_reply() -> None:
    async with node_at(echo) as (url, node), connect(url, timeout=5) as client:
        reply = await client.request(
            "svc",
            {"k": [1, "two"]},
            subject="PUT",
            to="/things/1",
            application_properties={"tenant": "t1", "n": 7},
            message_id="m-1",
            correlation_id="c-1",  # echo answers with this one, not the message-id
            content_type="application/x-thing",
        )
    (request,) = node.requests
    props = request.properties
    assert props is not None
    assert (props.message_id, props.correlation_id, props.reply_to) == ("m-1", "c-1", "$me")
    assert (props.subject, props.to, props.content_type) == (
        "PUT",
        "/things/1",
        "application/x-thing",
    )
    assert request.application_properties == {"tenant": "t1", "n": 7}
    assert request.body_kind == "value" and request.body == {"k": [1, "two"]}
    assert request.header is not None and 0 < (request.header.ttl or 0) <= 5000  # the deadline
    assert props.absolute_expiry_time is not None

    assert isinstance(reply, Reply) and reply.outcome is None  # sent pre-settled
    assert reply.body == {"k": [1, "two"]}
    assert reply.subject == "PUT" and reply.application_properties == {"tenant": "t1", "n": 7}
    assert reply.properties is not None and reply.properties.correlation_id == "c-1"
    assert reply.message is not None and reply.message.properties is reply.properties
    assert reply.status is None  # none carried


async def test_a_reply_is_matched_by_either_id_of_the_request() -> None:
    def by_message_id(request: Message) -> Message:
        assert request.properties is not None
        return Message(
            body="m", properties=Properties(correlation_id=request.properties.message_id)
        )

    async with node_at(by_message_id) as (url, _), connect(url, timeout=5) as client:
        reply = await client.request("svc", message_id=b"\x01id", correlation_id="other")
        assert reply.body == "m"
        assert client.in_flight() == 0  # it waited under both ids, and left both
        reply = await client.request("svc", "no ids given")  # the counter, as both
        assert reply.body == "m"


async def test_data_and_sequence_bodies_and_a_whole_message() -> None:
    async with node_at(echo) as (url, node), connect(url, timeout=5) as client:
        one = await client.request("svc", b"\x00\xff", body_kind="data")
        several = await client.request("svc", [b"ab", b"cd"], body_kind="data")
        sequence = await client.request("svc", [[1, "a"], [None]], body_kind="sequence")
        mine = Message(
            body=[b"x"],
            body_kind="data",
            header=Header(priority=9, ttl=60_000),
            message_annotations={"x-opt-origin": "test"},
            properties=Properties(subject="whole", user_id=b"guest"),
        )
        whole = await client.request("svc", mine, to="/there")
    assert (one.body, several.body, sequence.body) == (
        b"\x00\xff",
        [b"ab", b"cd"],
        [[1, "a"], [None]],
    )
    assert [m.body_kind for m in node.requests[:3]] == ["data", "data", "sequence"]
    assert whole.body == b"x" and whole.subject == "whole"
    sent = node.requests[3]
    assert sent.header is not None and (sent.header.priority, sent.header.ttl) == (9, 60_000)
    assert sent.message_annotations == {"x-opt-origin": "test"}
    assert sent.properties is not None and sent.properties.to == "/there"
    assert sent.properties.absolute_expiry_time is None  # its own ttl is its deadline
    assert mine.properties is not None and mine.properties.message_id is None  # left as given
    assert mine.properties.to is None


async def test_no_status_is_interpreted() -> None:
    def failing(request: Message) -> Message:
        assert request.properties is not None
        return Message(
            body="it broke",
            properties=Properties(correlation_id=request.properties.message_id, subject="503"),
            application_properties={wire.STATUS_CODE: 500, wire.STATUS_DESCRIPTION: "boom"},
        )

    async with node_at(failing) as (url, _), connect(url, timeout=5) as client:
        reply = await client.request("svc", subject="GET")
        assert reply.status == 500  # the management convention's status-code comes first
        assert reply.application_properties[wire.STATUS_DESCRIPTION] == "boom"
        assert reply.body == "it broke"
        with pytest.raises(RemoteError):  # the same reply fails a call
            await client.call("svc", "anything")


async def test_an_unsettled_request_comes_back_with_its_outcome() -> None:
    refusal = Error(condition=errors.NOT_ALLOWED, description="not you")

    def outcome(request: Message) -> Outcome:
        assert request.properties is not None
        return Rejected(error=refusal) if request.properties.subject == "no" else Accepted()

    async with (
        node_at(echo, outcome=outcome) as (url, node),
        connect(url, timeout=5, settled=False) as client,
    ):
        accepted = await client.request("svc", "yes please", subject="yes")
        rejected = await client.request("svc", "now", subject="no")
        assert client.in_flight() == 0
    assert isinstance(accepted.outcome, Accepted) and accepted.body == "yes please"
    assert isinstance(rejected.outcome, Rejected) and rejected.outcome.error == refusal
    assert rejected.message is None and rejected.body is None and rejected.status is None
    for link in node.links:
        assert link.remote_attach is not None
        assert link.remote_attach.snd_settle_mode == SND_UNSETTLED


async def test_a_request_times_out_and_its_id_is_free_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with node_at(lambda _request: None) as (url, node), connect(url, timeout=5) as client:
        with pytest.raises(TimeoutError, match=r"svc\.GET: no reply"):
            await client.request("svc", subject="GET", message_id="once", timeout=2)
        assert client.in_flight() == 0

        async def waits() -> None:
            with pytest.raises(TimeoutError):
                await client.request("svc", message_id="twice", timeout=1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waits)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(ValueError, match="already in flight"):
                await client.request("svc", message_id="twice")
            with pytest.raises(ValueError, match="already in flight"):
                await client.request("svc", correlation_id="twice")
        with pytest.raises(TimeoutError):  # free again
            await client.request("svc", message_id="twice", timeout=0.5)
    ids = [head(m).message_id for m in node.requests]
    assert ids == ["once", "twice", "twice"]
