"""A gateway's pass-through (``Connection.pass_through``, ``Hop.pass_on``) against its general
path: the same calls through the real chain of :mod:`tests.gateway.chain`, once as the gateway
relays them and once with the pass-through switched off, must put the same frames on the wire
(handles, delivery-ids, tags, settlement, credit) and the same bare messages."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pairlink import connect
from pairlink._amqp.connection import Connection
from pairlink._amqp.performatives import Flow, Transfer
from pairlink._gateway.relay import Hop
from tests.gateway.chain import CLIENT_ID, PUBLIC, SLOW, Chain, Decoded, open_chain, wait_until

CALLS = 30


def transfers(decoded: Decoded) -> list[tuple[Any, ...]]:
    return [
        (t.handle, t.delivery_id, t.delivery_tag, t.message_format, t.settled, t.more)
        for t in decoded.of(Transfer)
    ]


def per_link(decoded: Decoded) -> dict[Any, list[str]]:
    """The kinds of frames, in order, of each handle (None: the session's and connection's).
    Across links the order may differ: a message passed through as it is read goes out
    before a flow that an earlier frame of the same read asks for on another link."""
    out: dict[Any, list[str]] = {}
    for f in decoded.frames:
        out.setdefault(getattr(f, "handle", None), []).append(type(f).__name__)
    return out


def credit(decoded: Decoded) -> list[tuple[Any, ...]]:
    """What each link flow said of credit (session fields aside: they count frames)."""
    return [
        (f.handle, f.delivery_count, f.link_credit, f.drain)
        for f in decoded.of(Flow)
        if f.handle is not None
    ]


async def run_calls(chain: Chain) -> list[Decoded]:
    """``CALLS`` sequential pre-settled calls, then the frames of every hop, both ways."""
    async with connect(chain.url, container_id=CLIENT_ID) as client:
        for i in range(CALLS):
            value = f"call-{i}" * (i % 7)
            assert await client.call(PUBLIC, "echo", value) == value
    return [d for tap in chain.taps for d in (tap.up(), tap.down())]


class PassCount:
    """Counts the messages the hops passed through (and lets them pass)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.passed = 0
        pass_on = Hop.pass_on

        def counting(hop: Hop, payload: bytearray) -> bool:
            took = pass_on(hop, payload)
            self.passed += took
            return took

        monkeypatch.setattr(Hop, "pass_on", counting)


async def test_pass_through_puts_the_general_paths_frames_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = PassCount(monkeypatch)
    async with open_chain() as chain:
        fast = await run_calls(chain)
    assert count.passed == 2 * 2 * CALLS  # each request and reply, at GN and at GO

    with monkeypatch.context() as off:  # the general path: no link passes anything through
        off.setattr(Connection, "pass_through", lambda self, link, forward: None)
        count.passed = 0
        async with open_chain() as chain:
            general = await run_calls(chain)
        assert count.passed == 0

    for one, other in zip(fast, general, strict=True):
        assert transfers(one) == transfers(other)
        assert credit(one) == credit(other)
        assert per_link(one) == per_link(other)
        assert [m.settled for m in one.messages] == [m.settled for m in other.messages]
    for hops in (fast, general):  # the bare messages (dated by the clock): as the client's
        requests = [hops[i].messages for i in (0, 2, 4)]  # up: client->GN, GN->GO, GO->CO
        replies = [hops[i].messages for i in (1, 3, 5)]
        for way in (requests, replies):
            assert [m.bare for m in way[0]] == [m.bare for m in way[1]]
            assert [m.bare for m in way[0]] == [m.bare for m in way[2]]


async def test_pass_through_keeps_credit_end_to_end_and_holds_what_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slow service grants 2: calls beyond wait in the gateways (general path, in order)
    and pass through again once credit comes back; every reply arrives exactly once."""
    count = PassCount(monkeypatch)
    async with open_chain() as chain, connect(chain.url, container_id=CLIENT_ID) as client:
        results: list[int] = []

        async def one(i: int) -> None:
            results.append(await client.call(SLOW, "hold", i, timeout=20))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
            await wait_until(lambda: chain.slow.started >= 1)  # held: the rest waits for credit
            chain.slow.gate.set()
        assert sorted(results) == list(range(8))
        gn_go = chain.gn_go.up()
        requests = [m for m in gn_go.messages if m.message.application_properties]
        assert len(requests) == 8
        for t in gn_go.of(Transfer):  # each delivery-id once, in order, on the session
            assert t.settled is True and not t.more
        ids = [t.delivery_id for t in gn_go.of(Transfer)]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert count.passed > 0
