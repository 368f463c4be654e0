"""Link credit and session windows are uints (only the counts beside them are serial numbers),
drain completes as Part 2 §2.6.7 says, and the idle timeout counts from when input arrived."""

from __future__ import annotations

import pytest

from pairlink._amqp import errors
from pairlink._amqp.connection import ConnectionConfig
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.events import LinkFlow, TransportFailed
from pairlink._amqp.framing import HEARTBEAT
from pairlink._amqp.performatives import Close, Flow
from pairlink._amqp.testing import engine_pair, pump
from tests.amqp.engine_peer import attach_sender, begun, frames, linked, of, opened_pair, raw

VALUE = b"\x00Sw\x40"


@pytest.mark.parametrize("credit", [2**31 - 1, 2**31, 2**32 - 1])
def test_credit_of_2_31_and_more_is_credit(credit: int) -> None:
    """A common "unlimited" was read as a negative distance, so no credit at all."""
    client, server = opened_pair()
    sender, receiver = linked(client, server, credit=credit)
    assert sender.link_credit == credit and sender.usable_credit == 4096
    client.send(sender, VALUE)
    server.flow(receiver, credit)  # crosses the transfer: its delivery-count is one behind
    data = server.data_to_send()
    client.receive_data(data)
    (flow,) = frames(data)
    assert flow.delivery_count == 0 and flow.link_credit == credit
    assert sender.link_credit == credit - 1  # one delivery still in flight to the receiver
    pump(client, server)
    assert receiver.link_credit == credit - 1 and receiver.delivery_count == 1


def test_credit_beyond_a_uint_is_refused_locally() -> None:
    client, server = opened_pair()
    _, receiver = linked(client, server)
    with pytest.raises(LocalProtocolError) as exc:
        server.flow(receiver, 2**32)
    assert exc.value.condition == errors.INVALID_FIELD


def test_a_session_window_of_2_31_and_more_lets_transfers_through() -> None:
    _, server = opened_pair()
    begun(server)  # the peer's begin: incoming-window 2
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.data_to_send()
    (session,) = server.sessions.values()
    window = Flow(next_incoming_id=0, incoming_window=2**32 - 1, next_outgoing_id=0,
                  outgoing_window=9)  # fmt: skip
    server.receive_data(raw(0, window))
    assert session.remote_incoming_window == 2**32 - 1


def test_drain_advances_delivery_count_by_the_credit_left_and_zeroes_it() -> None:
    client, server = opened_pair()
    sender, receiver = linked(client, server, credit=7)
    client.send(sender, VALUE)
    pump(client, server)
    server.flow(receiver, 6, drain=True)
    ev_c, _ = pump(client, server)
    (flow_event,) = of(ev_c, LinkFlow)
    assert flow_event.link is sender and sender.drain and sender.link_credit == 6
    client.complete_drain(sender)
    data = client.data_to_send()
    (answer,) = frames(data)
    assert isinstance(answer, Flow) and answer.handle == sender.handle
    assert (answer.delivery_count, answer.link_credit, answer.drain) == (7, 0, True)
    server.receive_data(data)
    assert (receiver.delivery_count, receiver.link_credit) == (7, 0)
    client.complete_drain(sender)  # nothing left to drain: no frame
    assert client.data_to_send() == b""


def test_draining_unlimited_credit_wraps_the_delivery_count() -> None:
    client, server = opened_pair()
    sender, receiver = linked(client, server, credit=2**32 - 1)
    client.send(sender, VALUE)
    pump(client, server)
    server.flow(receiver, 2**32 - 2, drain=True)
    pump(client, server)
    client.complete_drain(sender)
    pump(client, server)
    assert sender.delivery_count == receiver.delivery_count == 2**32 - 1
    assert sender.link_credit == receiver.link_credit == 0


def test_without_drain_complete_drain_sends_nothing() -> None:
    client, server = opened_pair()
    sender, _ = linked(client, server, credit=5)
    client.complete_drain(sender)
    assert client.data_to_send() == b"" and sender.link_credit == 5


def test_the_idle_timeout_counts_from_the_time_input_arrived() -> None:
    """GO took 59 s to declare a hung peer dead with idle_timeout 30: the last frame was dated
    by the next tick, up to one timeout late. With the arrival time it fires on time."""
    client, server = engine_pair(ConnectionConfig("c", idle_timeout=30.0), ConnectionConfig("s"))
    client.open()
    server.open()
    pump(client, server)
    assert client.tick(0.0) == [] and client.next_deadline == 30.0
    client.receive_data(HEARTBEAT, now=0.5)  # the peer's last sign of life
    assert client.tick(30.0) == []  # the timer set before that input goes off: not yet
    assert client.next_deadline == 30.5
    events = client.tick(30.5)
    assert of(events, TransportFailed)
    (close,) = frames(client.data_to_send())
    assert close.error.condition == errors.RESOURCE_LIMIT_EXCEEDED


def test_heartbeats_count_from_the_time_output_was_written() -> None:
    client, server = engine_pair(ConnectionConfig("c"), ConnectionConfig("s", idle_timeout=10.0))
    client.open()
    server.open()
    pump(client, server)
    client.tick(100.0)
    assert client.next_deadline == 105.0
    client.begin()
    client.data_to_send(now=103.0)  # a write at 103 is as good as a heartbeat: next at 108
    assert client.tick(105.0) == [] and client.data_to_send() == b""
    assert client.next_deadline == 108.0
    client.tick(108.0)
    assert client.data_to_send() == HEARTBEAT


def test_a_peer_idle_timeout_too_short_to_heartbeat_for_is_an_invalid_field() -> None:
    client, server = engine_pair(ConnectionConfig("c", idle_timeout=0.001), ConnectionConfig("s"))
    client.open()
    server.receive_data(client.data_to_send())
    *_, close = frames(server.data_to_send(), headers=1)
    assert isinstance(close, Close) and close.error is not None
    assert close.error.condition == errors.INVALID_FIELD
    assert "idle-time-out 1 ms" in str(close.error.description)
