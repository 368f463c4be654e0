"""The link-pairing rules a service container must keep (LINK-PAIRING-RULES.md), frame by frame.

Each test drives a bare sans-IO engine over real TCP against ``open_server`` and checks the
frames the server sent: exactly the ones the rule names, and nothing else on that link.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from pairlink import handler, open_server, service
from pairlink._amqp import errors
from pairlink._amqp.messaging import Rejected
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Detach,
    Disposition,
    Flow,
    Open,
    Transfer,
)
from pairlink._rpc import wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, PAIRED, paired_properties
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, status


@service("calc")
class Calc:
    @handler
    def add(self, a: int, b: int) -> int:
        return a + b


@service("other")
class Other:
    @handler
    def ping(self) -> str:
        return "pong"


@service("legacy", pairing=False)
class Legacy:
    @handler
    def ping(self) -> str:
        return "pong"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Calc, Other, Legacy, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


@pytest.fixture
async def client(server: Server) -> AsyncIterator[RawClient]:
    async with raw_client(server.url) as c:
        yield c


def kinds(frames: list[Any]) -> list[type]:
    return [type(f) for f in frames]


async def until_detached(c: RawClient, name: str, server_role: bool) -> list[Any]:
    def detached() -> bool:
        return any(isinstance(f, Detach) for f in c.link_frames(name, server_role))

    await c.read_until(detached)
    return c.link_frames(name, server_role)


# -- LP-1 ------------------------------------------------------------------------------------


async def test_lp1_open_offers_link_pair_v1_0(client: RawClient) -> None:
    (open_frame,) = client.of(Open)
    assert LINK_PAIR_V1_0 in [str(c) for c in open_frame.offered_capabilities]


async def test_lp1_offered_even_to_a_peer_that_does_not_desire_it(server: Server) -> None:
    async with raw_client(server.url, desired=()) as c:
        (open_frame,) = c.of(Open)
        assert LINK_PAIR_V1_0 in [str(cap) for cap in open_frame.offered_capabilities]


# -- LP-3 ------------------------------------------------------------------------------------


async def test_lp3_a_pair_is_the_two_links_of_one_name_not_any_with_mirrored_addresses(
    server: Server, client: RawClient
) -> None:
    """On one connection (so between the same two containers), "$me" is the receiving link of
    the request link's own name: not another whose addresses mirror it just as well, and none
    at all when only links of other names mirror it."""
    decoy = client.attach(
        "n2", ROLE_RECEIVER, source="calc", target="me", properties=paired_properties()
    )
    client.engine.flow(decoy, 10)
    sender, receiver = client.pair("calc", "n1")  # attached after the decoy: order is no clue
    mid, _ = client.request(sender, "add", 2, 3)
    reply = await client.wait_reply(mid)
    assert client.replies(receiver) == [reply] and client.replies(decoy) == []

    # the server's halves of the pair: one name, paired: true, own addresses mirrored
    (open_frame,) = client.of(Open)
    assert open_frame.container_id == server.container_id
    (receiving,) = client.of(Attach, name="n1", role=ROLE_RECEIVER)
    (sending,) = client.of(Attach, name="n1", role=ROLE_SENDER)
    assert receiving.properties == sending.properties == {PAIRED: True}
    assert receiving.source.address == sending.target.address == "me"
    assert sending.source.address == receiving.target.address == "calc"

    # mirrored addresses and paired: true on both, but two names: no pair, so "$me" names no
    # link; the request is refused and nothing goes out on the receiving link
    lone = client.attach(
        "a", ROLE_SENDER, source="me", target="other", properties=paired_properties()
    )
    other = client.attach(
        "b", ROLE_RECEIVER, source="other", target="me", properties=paired_properties()
    )
    client.engine.flow(other, 10)
    lone_call, delivery = client.request(lone, "ping", settled=False)
    await client.read_until(lambda: delivery.remote_settled)
    assert isinstance(delivery.remote_state, Rejected)
    assert delivery.remote_state.error is not None
    assert delivery.remote_state.error.condition == errors.NOT_FOUND
    assert client.reply_to(lone_call) is None and client.replies(other) == []
    assert not client.of(Detach)  # each is a link of its own, attached and unharmed


# -- LP-4 ------------------------------------------------------------------------------------


async def test_lp4_paired_attach_is_answered_with_paired_true(client: RawClient) -> None:
    client.pair("calc", "n")
    await client.read_until(lambda: len(client.of(Attach, name="n")) == 2)
    for answer in client.of(Attach, name="n"):
        assert answer.properties == {PAIRED: True}
        assert answer.properties[PAIRED] is True  # the boolean, not a truthy value


@pytest.mark.parametrize("value", ["true", 1, False])
async def test_lp4_any_other_value_of_paired_means_not_paired(
    client: RawClient, value: Any
) -> None:
    props = {PAIRED: value}
    sender = client.attach("n", ROLE_SENDER, source="me", target="calc", properties=props)
    receiver = client.attach("n", ROLE_RECEIVER, source="calc", target="me", properties=props)
    client.engine.flow(receiver, 10)
    mid, _ = client.request(sender, "add", 1, 2, settled=False)  # reply-to $me
    await client.read_until(lambda: bool(client.dispositions()))
    answers = client.of(Attach, name="n")
    assert len(answers) == 2 and all(a.properties is None for a in answers)
    # not a pair, so "$me" names no link: the request is rejected, never answered
    (disposition,) = client.dispositions()
    assert isinstance(disposition.state, Rejected)
    assert disposition.state.error is not None
    assert disposition.state.error.condition == errors.NOT_FOUND
    assert client.reply_to(mid) is None


# -- LP-5 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("first_paired", [True, False])
async def test_lp5_halves_that_disagree_about_paired_detach_with_precondition_failed(
    client: RawClient, first_paired: bool
) -> None:
    first = paired_properties() if first_paired else None
    second = None if first_paired else paired_properties()
    client.attach("n", ROLE_SENDER, source="me", target="calc", properties=first)
    client.attach("n", ROLE_RECEIVER, source="calc", target="me", properties=second)
    frames = await until_detached(client, "n", ROLE_SENDER)
    assert kinds(frames) == [Attach, Detach]
    answer, detach = frames
    assert answer.properties == second  # the attach frames of this link agree (LP-5)
    assert answer.source is not None and answer.source.address == "calc"
    assert detach.closed is True
    assert detach.error.condition == errors.PRECONDITION_FAILED
    # the first half is untouched: attached, with credit
    assert kinds(client.link_frames("n", ROLE_RECEIVER)) == [Attach, Flow]


# -- LP-6 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("our_role", [ROLE_SENDER, ROLE_RECEIVER])
async def test_lp6_paired_attach_to_an_address_that_does_not_pair(
    client: RawClient, our_role: bool
) -> None:
    if our_role is ROLE_SENDER:
        client.attach("n", our_role, source="me", target="legacy", properties=paired_properties())
    else:
        client.attach("n", our_role, source="legacy", target="me", properties=paired_properties())
    server_role = not our_role
    frames = await until_detached(client, "n", server_role)
    assert kinds(frames) == [Attach, Detach]  # no credit, nothing else
    answer, detach = frames
    local = answer.target if server_role is ROLE_RECEIVER else answer.source
    assert local is None  # the null local terminus: the link was not created
    assert detach.closed is True
    assert detach.error.condition == errors.NOT_IMPLEMENTED


async def test_lp6_a_dynamic_node_does_not_pair(client: RawClient) -> None:
    client.attach("n", ROLE_RECEIVER, dynamic=True, properties=paired_properties())
    answer, detach = await until_detached(client, "n", ROLE_SENDER)
    assert answer.source is None
    assert detach.closed is True and detach.error.condition == errors.NOT_IMPLEMENTED


@pytest.mark.parametrize("paired", [True, False])
async def test_unknown_address_is_refused_with_not_found(client: RawClient, paired: bool) -> None:
    props = paired_properties() if paired else None
    client.attach("n", ROLE_SENDER, source="me", target="nowhere", properties=props)
    frames = await until_detached(client, "n", ROLE_RECEIVER)
    assert kinds(frames) == [Attach, Detach]
    answer, detach = frames
    assert answer.target is None
    assert detach.closed is True and detach.error.condition == errors.NOT_FOUND


# -- LP-7 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target"),
    [("calc", "someone-else"), ("other", "me")],
    ids=["target-differs", "source-differs"],
)
async def test_lp7_paired_halves_with_other_addresses_detach_with_precondition_failed(
    client: RawClient, source: str, target: str
) -> None:
    props = paired_properties()
    client.attach("n", ROLE_SENDER, source="me", target="calc", properties=props)
    client.attach("n", ROLE_RECEIVER, source=source, target=target, properties=props)
    frames = await until_detached(client, "n", ROLE_SENDER)
    assert kinds(frames) == [Attach, Detach]
    answer, detach = frames
    assert answer.properties == props and answer.source.address == source
    assert detach.closed is True
    assert detach.error.condition == errors.PRECONDITION_FAILED
    assert kinds(client.link_frames("n", ROLE_RECEIVER)) == [Attach, Flow]


async def test_lp7_a_pair_that_ended_with_its_session_no_longer_constrains_the_name(
    client: RawClient,
) -> None:
    client.pair("calc", "n", here="first")
    first_session = client.session
    await client.read_until(lambda: len(client.of(Attach, name="n")) == 2)
    client.engine.end(first_session)  # its links end with it, without detaches of their own
    client.session = client.engine.begin()
    sender, receiver = client.pair("calc", "n", here="second")  # other addresses, same name
    mid, _ = client.request(sender, "add", 1, 2)
    reply = await client.wait_reply(mid)
    assert client.replies(receiver) == [reply] and not client.of(Detach)


# -- LP-8 ------------------------------------------------------------------------------------


async def test_lp8_reply_to_me_answers_on_the_paired_link_with_to_me(client: RawClient) -> None:
    sender, receiver = client.pair("calc", "n")
    mid, _ = client.request(sender, "add", 2, 3)
    reply = await client.wait_reply(mid)
    assert client.replies(receiver) == [reply]
    assert reply.properties is not None
    assert reply.properties.to == wire.ME and reply.properties.correlation_id == mid
    assert status(reply) == 200 and wire.parse_reply(reply) == 5
    (transfer,) = client.of(Transfer)
    (reply_half,) = client.of(Attach, name="n", role=ROLE_SENDER)
    assert transfer.handle == reply_half.handle


async def test_lp8_other_reply_to_goes_to_the_link_with_that_target_not_the_pair(
    client: RawClient,
) -> None:
    sender, receiver = client.pair("calc", "n")
    # the AMQP-management pattern: a receiving link whose target is the reply address
    replies = client.attach("mgmt", ROLE_RECEIVER, source="calc", target="my-replies")
    client.engine.flow(replies, 10)
    mid, _ = client.request(sender, "add", 4, 5, reply_to="my-replies")
    reply = await client.wait_reply(mid)
    assert client.replies(replies) == [reply] and client.replies(receiver) == []
    assert reply.properties is not None and reply.properties.to == "my-replies"
    assert wire.parse_reply(reply) == 9


async def test_lp8_unknown_reply_to_is_rejected_with_not_found(client: RawClient) -> None:
    sender, _ = client.pair("calc", "n")
    mid, delivery = client.request(sender, "add", 1, 1, reply_to="nowhere", settled=False)
    await client.read_until(lambda: bool(client.dispositions()))
    (disposition,) = client.dispositions()
    assert disposition.first == delivery.delivery_id and disposition.settled
    assert isinstance(disposition.state, Rejected)
    assert disposition.state.error is not None
    assert disposition.state.error.condition == errors.NOT_FOUND
    # a pre-settled one can only be dropped (and logged): the next call overtakes nothing
    lost, _ = client.request(sender, "add", 1, 1, reply_to="nowhere")
    later, _ = client.request(sender, "add", 2, 2)
    await client.wait_reply(later)
    assert client.reply_to(mid) is None and client.reply_to(lost) is None
    assert len(client.of(Transfer)) == 1


# -- LP-10 (the responder's half: credit at once) ----------------------------------------------


async def test_lp10_credit_goes_out_before_the_pipelined_request_is_read(
    client: RawClient,
) -> None:
    sender, _ = client.pair("calc", "n")
    mid, _ = client.request(sender, "add", 1, 2)  # attach, attach, flow, transfer: one write
    await client.wait_reply(mid)
    frames = [f for f in client.frames if isinstance(f, Attach | Flow | Transfer | Detach)]
    assert kinds(frames) == [Attach, Flow, Attach, Transfer]
    request_half, flow, reply_half, transfer = frames
    assert isinstance(request_half, Attach) and isinstance(flow, Flow)
    assert request_half.role is ROLE_RECEIVER and flow.handle == request_half.handle
    assert flow.link_credit is not None and flow.link_credit >= 1
    assert transfer.handle == reply_half.handle


# -- LP-12 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("paired", [True, False])
async def test_lp12_attach_with_and_without_paired_both_serve_calls(
    client: RawClient, paired: bool
) -> None:
    if paired:
        sender, receiver = client.pair("calc", "n")
        reply_to = wire.ME
    else:  # classic: a sender to the service, replies to a dynamic node of the server
        sender = client.attach("req", ROLE_SENDER, source="me", target="calc")
        receiver = client.attach("rsp", ROLE_RECEIVER, dynamic=True)
        client.engine.flow(receiver, 10)
        await client.wait_attached(receiver)
        assert receiver.remote_source is not None
        reply_to = str(receiver.remote_source.address)
        assert reply_to.endswith("/dyn/1") and receiver.remote_source.dynamic
    mid, _ = client.request(sender, "add", 20, 22, reply_to=reply_to, settled=False)
    reply = await client.wait_reply(mid)
    assert client.replies(receiver) == [reply] and wire.parse_reply(reply) == 42
    for answer in client.of(Attach):
        assert (answer.properties == paired_properties()) is paired
    assert not client.of(Detach)
    await client.read_until(lambda: bool(client.of(Disposition)))
    assert client.of(Disposition)[0].state is not None
