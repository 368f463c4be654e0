"""A disposition costs what it changes, and unsettled deliveries are bounded per session (issue
22): a range as wide as 2^31 over a full table visits only the deliveries it settles; one that
only declares an outcome changes each delivery once, and one with no state or a received state
changes nothing; ranges wrap at 2^32; a session holds at most ``max_session_unsettled`` each
way, the peer's by our incoming window and ours by our links' usable credit.

The work is counted in keys visited (``Unsettled.visited``), not timed."""

from __future__ import annotations

from typing import Any

import pytest

from pairlink._amqp import errors
from pairlink._amqp.connection import Connection
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.events import (
    DeliveryUpdated,
    Event,
    LinkAttachRequested,
    LinkFlow,
    MessageReceived,
)
from pairlink._amqp.link import SERIAL_MASK, Delivery, Link
from pairlink._amqp.messaging import Accepted, Modified, Received, Source, Target
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Begin,
    Close,
    Disposition,
    Flow,
    Transfer,
)
from pairlink._amqp.session import Session
from pairlink._amqp.testing import pump
from pairlink._amqp.unsettled import SerialIndex
from tests.amqp.engine_peer import attach_sender, frames, linked, of, opened_pair, raw

VALUE = b"\x00Sw\x40"  # an amqp-value null: the smallest message
WIDEST = 2**31 - 1


def held(count: int, *, first_id: int = 0) -> tuple[Connection, Link, list[Delivery]]:
    """A client holding ``count`` unsettled deliveries the server received, numbered from
    ``first_id``; the server's dispositions are then written by hand."""
    client, server = opened_pair()
    sender, _ = linked(client, server, credit=count)
    client.sessions[0].next_delivery_id = first_id
    deliveries = [client.send(sender, VALUE) for _ in range(count)]
    pump(client, server)
    return client, sender, deliveries


def dispose(client: Connection, first: int, last: int | None, **fields: Any) -> list[Delivery]:
    """The peer's disposition of our deliveries [first, last]: those the client says changed."""
    events = client.receive_data(
        raw(0, Disposition(role=ROLE_RECEIVER, first=first, last=last, **fields))
    )
    return [e.delivery for e in of(events, DeliveryUpdated)]


def test_a_wide_settling_range_visits_only_the_deliveries_it_settles() -> None:
    client, sender, deliveries = held(300)
    table = client.sessions[0].unsettled_out
    settled = dispose(client, 100, WIDEST, settled=True, state=Accepted())
    assert settled == deliveries[100:]
    assert table.visited == 200 and len(table) == 100 and sender.unsettled == 100
    assert all(d.remote_settled and isinstance(d.remote_state, Accepted) for d in settled)
    for _ in range(10):  # the same range again, and again: nothing left in it, nothing visited
        assert dispose(client, 100, WIDEST, settled=True) == []
    assert table.visited == 200
    assert dispose(client, 0, 99, settled=True) == deliveries[:100]
    assert table.visited == 300 and not table and sender.unsettled == 0


def test_a_repeated_outcome_over_the_same_range_changes_each_delivery_once() -> None:
    """rcv-settle-mode second: the receiver declares an outcome and leaves the settle to us.
    The outcome is terminal: its repeat is no reason to look at those deliveries again."""
    client, _, deliveries = held(200)
    table = client.sessions[0].unsettled_out
    assert dispose(client, 0, WIDEST, state=Accepted()) == deliveries
    assert table.visited == 200
    for _ in range(10):
        assert dispose(client, 0, WIDEST, state=Modified()) == []
        assert dispose(client, 7, None, state=Modified()) == []
    assert table.visited == 200 and len(table) == 200
    assert all(isinstance(d.remote_state, Accepted) for d in deliveries)
    assert dispose(client, 0, WIDEST, settled=True) == deliveries  # the decided settle as well
    assert table.visited == 400 and not table


@pytest.mark.parametrize("state", [None, Received(section_number=0, section_offset=0)])
def test_a_disposition_that_settles_nothing_and_decides_nothing_costs_nothing(
    state: Received | None,
) -> None:
    """The issue's frame: ``disposition(first=0, last=2^31-1)``, no state, not settled."""
    client, _, deliveries = held(200)
    table = client.sessions[0].unsettled_out
    for _ in range(20):
        assert dispose(client, 0, WIDEST, state=state) == []
        assert dispose(client, 5, None, state=state) == []
    assert table.visited == 0 and len(table) == 200
    assert all(d.remote_state is None and not d.remote_settled for d in deliveries)


def test_ranges_wrap_around_at_2_32() -> None:
    client, _, deliveries = held(8, first_id=2**32 - 4)
    ids = [d.delivery_id for d in deliveries]
    assert ids == [2**32 - 4, 2**32 - 3, 2**32 - 2, 2**32 - 1, 0, 1, 2, 3]
    assert dispose(client, 2**32 - 3, 1, settled=True) == deliveries[1:6]  # across the wrap
    assert dispose(client, 3, 2**32 - 4, settled=True) == []  # "last < first": refused
    assert client.closed
    client, _, deliveries = held(8, first_id=2**32 - 4)
    assert (
        dispose(client, 2**32 - 1, (2**32 - 1 + WIDEST) & SERIAL_MASK, settled=True)
        == (deliveries[3:])
    )
    assert dispose(client, 2**32 - 4, None, settled=True) == deliveries[:1]  # by id
    assert [d.delivery_id for d in client.sessions[0].unsettled_out] == ids[1:3]


def test_a_delivery_finished_after_a_later_one_is_still_found_by_range() -> None:
    """The peer's multi-frame delivery 5 ends after delivery 6, on another link: the index
    takes it out of order, and ranges still see it in its place."""
    index = SerialIndex()
    made = {i: Delivery(None, i, b"t") for i in (4, 6, 5, 7)}  # type: ignore[arg-type]
    for delivery in made.values():
        index.add(delivery)
    assert [d.delivery_id for d in index.take_range(5, 1)] == [5, 6]
    assert index.discard(made[4]) and len(index) == 1
    assert [d.delivery_id for d in index.take_range(0, WIDEST)] == [7]
    assert index.visited == 4  # 5, 6, then 4 (dead) and 7


def test_settled_keys_are_compacted_away() -> None:
    """Deliveries settled by id leave their keys behind only until dead ones outnumber the
    live ones (plus a little): the list never grows with the deliveries ever settled."""
    index = SerialIndex()
    live = []
    for i in range(10_000):
        delivery = Delivery(None, i, b"t")  # type: ignore[arg-type]
        index.add(delivery)
        live.append(delivery)
        if len(live) > 10:
            assert index.discard(live.pop(0))
    assert len(index) == 10
    assert len(index._keys) <= 2 * 10 + 64 + 1
    assert [d.delivery_id for d in index.take_range(0, WIDEST)] == list(range(9990, 10_000))


# -- the session's bound -------------------------------------------------------------------


def test_a_sender_at_the_session_bound_waits_and_is_woken_when_the_peer_settles() -> None:
    client, server = opened_pair()
    client.config.max_session_unsettled = 3
    session = client.begin()
    assert session.max_unsettled == 3
    a, b = (_link(client, server, session, name) for name in ("a", "b"))
    sent = [client.send(a, VALUE) for _ in range(3)]
    assert (a.usable_credit, b.usable_credit) == (0, 0)  # b: the session holds 3 already
    assert b.send_blocked and b.unsettled == 0 and b.link_credit == 10
    with pytest.raises(LocalProtocolError) as exc:
        client.send(b, VALUE)
    assert exc.value.condition == errors.RESOURCE_LIMIT_EXCEEDED
    assert "max_session_unsettled 3" in str(exc.value)
    client.send(b, VALUE, settled=True)  # a pre-settled one needs only the credit
    _, server_events = pump(client, server)
    received = [m.delivery for m in of(server_events, MessageReceived)]
    server.settle(received[0], Accepted())
    client_events, _ = pump(client, server)
    assert [e.delivery for e in of(client_events, DeliveryUpdated)] == sent[:1]
    assert {e.link for e in of(client_events, LinkFlow)} >= {b}  # woken: room again
    assert (b.usable_credit, b.send_blocked) == (1, False)
    client.send(b, VALUE)


def _link(client: Connection, server: Connection, session: Session, name: str) -> Link:
    """A sender of ``client`` on ``session``, attached to a server receiver with credit 10."""
    sender = client.attach(
        session, name=name, role=ROLE_SENDER, source=Source(address="a"), target=Target("q")
    )
    _, events = pump(client, server)
    (request,) = of(events, LinkAttachRequested)
    receiver = request.link
    server.answer_attach(receiver, source=receiver.remote_source, target=receiver.remote_target)
    server.flow(receiver, 10)
    pump(client, server)
    return sender


def test_the_incoming_window_never_lets_the_peer_past_the_session_bound() -> None:
    """Our incoming window is at most the room left under the bound: the peer's deliveries
    beyond it wait (its engine holds them), and settling ours reopens the window."""
    client, server = opened_pair(max_session_unsettled=3)
    sender, _ = linked(client, server, credit=10)
    server_session = server.sessions[0]
    assert client.sessions[0].remote_incoming_window <= 3
    for _ in range(5):
        client.send(sender, VALUE)
    _, events = pump(client, server)
    received = [m.delivery for m in of(events, MessageReceived)]
    assert len(received) == 3 and client.sessions[0].blocked_bytes  # two wait for the window
    assert len(server_session.unsettled_in) == 3
    server.settle(received[0], Accepted())
    server.settle(received[1], Accepted())
    out = frames(server.data_to_send())
    assert [type(f) for f in out] == [Disposition, Flow] and out[1].incoming_window == 2
    client.receive_data(raw(0, out[0]) + raw(0, out[1]))
    _, events = pump(client, server)
    assert len(of(events, MessageReceived)) == 2 and not client.sessions[0].blocked_bytes
    assert len(server_session.unsettled_in) == 3


def test_a_peer_sending_past_the_closed_window_breaks_the_connection() -> None:
    _, server = opened_pair(max_session_unsettled=2)
    events: list[Event] = server.receive_data(
        raw(0, Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9))
    )
    (begin,) = [f for f in frames(server.data_to_send()) if isinstance(f, Begin)]
    assert begin.incoming_window == 2
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.flow(link, 10)
    server.data_to_send()
    for delivery_id in range(3):
        transfer = Transfer(handle=0, delivery_id=delivery_id, delivery_tag=b"%d" % delivery_id)
        events += server.receive_data(raw(0, transfer, VALUE))
    assert len(of(events, MessageReceived)) == 2
    (close,) = [f for f in frames(server.data_to_send()) if isinstance(f, Close)]
    assert close.error is not None and close.error.condition == errors.WINDOW_VIOLATION
