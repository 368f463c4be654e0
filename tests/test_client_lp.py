"""The link-pairing rules on the client's side, checked on the frames it sends and answers.

LP-2 (desire the capability, pair only when offered), LP-10 (the pipelined burst), LP-5 (the
peer's answer must be paired too), and a refused pair (LP-6 seen from the caller). Peers: a
real Proton container, and a raw engine server (``tests.client_peers``) that records every
frame and answers as each test says.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pairlink import connect
from pairlink._amqp import errors as conditions
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Error
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_SETTLED,
    Attach,
    Begin,
    Detach,
    Flow,
    Open,
    Transfer,
)
from pairlink._amqp.types import Symbol
from pairlink._rpc import wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, PAIRED
from pairlink.errors import LinkDetachedError
from tests.client_peers import Incoming, RawPeer, proton_arithmetic, raw_server
from tests.interop.proton_peers import ProtonServer

# -- LP-2 ------------------------------------------------------------------------------------


async def test_lp2_desires_the_capability_and_pairs_when_offered() -> None:
    with ProtonServer(offered_capabilities=["LINK_PAIR_V1_0"], responder=proton_arithmetic) as px:
        async with connect(px.url(), timeout=5) as client:
            assert await client.call("calc", "add", 1, 2) == 3
    (peer,) = px.connections
    assert "LINK_PAIR_V1_0" in peer.desired_capabilities
    assert "LINK_PAIR_V1_0" not in peer.offered_capabilities  # LP-1: a pure client never offers
    request_half, reply_half = px.links  # the server's role: receiver of requests, then sender
    assert (request_half.role, reply_half.role) == ("receiver", "sender")
    assert request_half.name == reply_half.name
    for half in (request_half, reply_half):
        assert half.properties == {Symbol("paired"): True}
    # LP-3: the addresses mirror each other
    assert (request_half.source, request_half.target) == (reply_half.target, reply_half.source)
    assert request_half.target == "calc"
    assert px.received[0].message.reply_to == wire.ME


async def test_lp2_without_the_offer_no_pair_but_a_dynamic_reply_address() -> None:
    with ProtonServer(responder=proton_arithmetic) as px:
        async with connect(px.url(), timeout=5) as client:
            calc = await client.service("calc")
            assert await calc.add(2, 3) == 5
            assert await calc.mul(2, 4) == 8
    (peer,) = px.connections
    assert "LINK_PAIR_V1_0" in peer.desired_capabilities
    assert all(link.properties is None for link in px.links)
    request_link, reply_link = px.links
    assert request_link.target == "calc" and request_link.name != reply_link.name
    assert reply_link.dynamic and reply_link.source is not None
    assert {r.message.reply_to for r in px.received} == {reply_link.source}


async def test_lp2_open_frame_carries_the_desired_capability() -> None:
    async with raw_server(offer=False) as server, connect(server.url, sasl=False):
        pass
    (open_,) = server.peers[0].performatives(Open)
    assert open_.desired_capabilities == [LINK_PAIR_V1_0]
    assert not open_.offered_capabilities


# -- LP-10 -----------------------------------------------------------------------------------


async def test_lp10_attach_attach_flow_transfer_in_one_burst_before_any_answer() -> None:
    """The server reads nothing past the first attach until a transfer has come: a client
    that waited for the attach answers would never send it, and this test would time out."""
    async with (
        raw_server(hold_links=True) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        with trio.fail_after(5):
            assert await client.call("calc", "add", 1, 2) == 3
        peer = server.peers[0]
    frames = [(read, p) for read, p in peer.frames if not isinstance(p, Open | Begin)]
    burst = frames[:4]
    sender, receiver, flow, transfer = (p for _, p in burst)
    assert isinstance(sender, Attach) and sender.role is ROLE_SENDER
    assert isinstance(receiver, Attach) and receiver.role is ROLE_RECEIVER
    assert isinstance(flow, Flow) and flow.handle == receiver.handle and flow.link_credit
    assert isinstance(transfer, Transfer) and transfer.handle == sender.handle
    assert len({read for read, _ in burst}) == 1, "the four frames came in one write"
    # the pair, as LP-3/LP-4 want it
    assert sender.name == receiver.name
    assert sender.properties == receiver.properties == {PAIRED: True}
    assert sender.source and sender.target and receiver.source and receiver.target
    assert sender.target.address == receiver.source.address == "calc"
    assert sender.source.address == receiver.target.address
    # pre-settled requests, and the reply link asks for pre-settled replies
    assert transfer.settled and sender.snd_settle_mode == receiver.snd_settle_mode == SND_SETTLED
    request = peer.incoming[0].message
    assert request.properties is not None and request.properties.reply_to == wire.ME


async def test_lp10_only_the_first_request_goes_without_credit() -> None:
    """Five calls start together on a fresh pair whose service grants one credit at a time:
    the first is pipelined, the others wait for real credit (none is refused for lack of
    it, which would detach the link with transfer-limit-exceeded)."""

    def one_at_a_time(incoming: Incoming) -> None:
        incoming.reply(sum(incoming.request.args))
        incoming.peer.engine.flow(incoming.link, 1)

    async with (
        raw_server(hold_links=True, credit=1, on_request=one_at_a_time) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        results: list[int] = []
        async with trio.open_nursery() as nursery:
            for i in range(5):

                async def one(i: int = i) -> None:
                    results.append(await client.call("calc", "add", i, 100))

                nursery.start_soon(one)
        peer = server.peers[0]
    assert sorted(results) == [100, 101, 102, 103, 104]
    (first_attach,) = [read for read, p in peer.frames if isinstance(p, Attach)][:1]
    in_burst = [p for read, p in peer.frames if read == first_attach and isinstance(p, Transfer)]
    assert len(in_burst) == 1
    assert not peer.performatives(Detach)


# -- LP-5 ------------------------------------------------------------------------------------


def answer_with(properties: dict[Any, Any] | None) -> Any:
    def answer(peer: RawPeer, link: Link) -> None:
        peer.engine.answer_attach(
            link, source=link.remote_source, target=link.remote_target, properties=properties
        )
        if link.is_receiver:
            peer.engine.flow(link, 10)

    return answer


@pytest.mark.parametrize(
    "properties",
    [None, {PAIRED: False}, {PAIRED: "true"}, {Symbol("other"): True}],
    ids=["absent", "false", "string-true", "other-key"],
)
async def test_lp5_answer_not_paired_is_detached_with_precondition_failed(
    properties: dict[Any, Any] | None,
) -> None:
    """The peer answers our paired attaches without ``paired: true`` (and even replies): the
    call fails, and we detach both halves with precondition-failed."""
    async with (
        raw_server(answer=answer_with(properties)) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        with pytest.raises(LinkDetachedError) as exc:
            await client.call("calc", "add", 1, 2)
        assert exc.value.condition == conditions.PRECONDITION_FAILED
        assert "LP-5" in str(exc.value)
        peer = server.peers[0]
        with trio.fail_after(5):
            await peer.wait_for(Detach, 2)
    detaches = peer.performatives(Detach)
    assert {d.handle for d in detaches} == {a.handle for a in peer.performatives(Attach)}
    for detach in detaches:
        assert detach.closed and detach.error.condition == conditions.PRECONDITION_FAILED


async def test_lp5_paired_answer_passes_the_check() -> None:
    async with (
        raw_server(answer=answer_with({PAIRED: True})) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        assert await client.call("calc", "add", 1, 2) == 3
        assert await client.call("calc", "add", 3, 4) == 7
    assert not server.peers[0].performatives(Detach)


# -- a refused pair (the service's LP-6, seen by the caller) ----------------------------------


def refuse(condition: str) -> Any:
    def answer(peer: RawPeer, link: Link) -> None:
        peer.engine.refuse_attach(link, Error(condition=condition, description="no pairing here"))

    return answer


async def test_refused_pair_raises_link_detached_with_the_condition() -> None:
    async with (
        raw_server(answer=refuse(conditions.NOT_IMPLEMENTED)) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        for _ in range(2):  # a refused pair is forgotten: the next call tries a new one
            with pytest.raises(LinkDetachedError) as exc:
                await client.call("calc", "add", 1, 2)
            assert exc.value.condition == conditions.NOT_IMPLEMENTED
            assert exc.value.description == "no pairing here"
    attaches = server.peers[0].performatives(Attach)
    assert len(attaches) == 4 and len({a.name for a in attaches}) == 2


async def test_request_refused_on_a_pair_reaches_only_that_call() -> None:
    """A detach of one pair fails that pair's calls; the other pair lives on."""

    def detach_b(incoming: Incoming) -> None:
        if incoming.link.remote_target and incoming.link.remote_target.address == "b":
            incoming.peer.engine.detach(
                incoming.link, error=Error(condition=conditions.RESOURCE_DELETED)
            )
            incoming.peer.kick()
        else:
            incoming.reply(sum(incoming.request.args))

    async with (
        raw_server(on_request=detach_b) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        with pytest.raises(LinkDetachedError) as exc:
            await client.call("b", "add", 1)
        assert exc.value.condition == conditions.RESOURCE_DELETED
        assert await client.call("a", "add", 1, 1) == 2
