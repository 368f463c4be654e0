"""What a peer can make the engine hold is bounded, and going past a bound is answered with the
AMQP condition that names it: channels and handles beyond the negotiated maxima, incomplete
incoming messages per connection, values decoded per frame or message, unsettled deliveries
per link. Each test feeds bytes to an engine and asserts the frames it answers with."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest

from pairlink._amqp import errors
from pairlink._amqp.codec import MAX_ELEMENTS, decode, encode
from pairlink._amqp.connection import Connection
from pairlink._amqp.errors import DecodeError, LocalProtocolError
from pairlink._amqp.events import (
    DeliveryUpdated,
    LinkAttachRequested,
    LinkDetached,
    MessageReceived,
    ProtocolViolation,
    SessionBegun,
)
from pairlink._amqp.framing import HEARTBEAT
from pairlink._amqp.messaging import Accepted, Message, Source, Target
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Begin,
    Detach,
    Open,
    Transfer,
)
from pairlink._amqp.testing import pump
from pairlink._amqp.types import Symbol
from tests.amqp.engine_peer import (
    attach_sender,
    begun,
    frames,
    linked,
    of,
    opened_pair,
    raw,
    server_frames_after,
    violation,
)

BEGIN = Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100)
VALUE = b"\x00Sw\x40"  # an amqp-value null: the smallest message


# -- channels and handles (Part 2 §2.7.1, §2.7.2) -------------------------------------------


def test_more_sessions_than_the_peer_channel_max_allows_is_not_allowed() -> None:
    """The issue's crash: open(channel-max 0), then begins on channels 0 and 1. The second
    needs a channel of ours above 0, which the peer said it cannot handle."""
    _, server = opened_pair()  # (the pair's client announced the default channel-max)
    server.remote_open = None  # as if the peer's open had not come yet: send ours by hand
    server_open = raw(0, Open(container_id="peer", channel_max=0))
    events, out = server_frames_after(server, server_open + raw(0, BEGIN) + raw(1, BEGIN))
    assert len(of(events, SessionBegun)) == 1
    assert isinstance(out[0], Begin) and out[0].remote_channel == 0
    assert violation(events, out) == errors.NOT_ALLOWED
    assert "channel-max 0" in out[-1].error.description


def test_a_channel_above_our_channel_max_is_a_framing_error() -> None:
    _, server = opened_pair(channel_max=3)
    events, out = server_frames_after(server, raw(3, BEGIN) + raw(4, BEGIN))
    assert len(of(events, SessionBegun)) == 1
    assert violation(events, out) == errors.FRAMING_ERROR


def test_a_handle_above_our_handle_max_is_a_framing_error() -> None:
    _, server = opened_pair(handle_max=3)
    begun(server)
    attach_sender(server, handle=3, name="ok")
    server.resume_input()  # after the attach request
    events, out = server_frames_after(
        server, raw(0, Attach(name="x", handle=4, role=ROLE_SENDER, initial_delivery_count=0))
    )
    assert violation(events, out) == errors.FRAMING_ERROR


def test_more_links_than_the_peer_handle_max_allows_is_not_allowed() -> None:
    _, server = opened_pair()
    server.receive_data(raw(0, Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9,
                                     handle_max=0)))  # fmt: skip
    server.data_to_send()
    first = attach_sender(server, handle=0, name="a")
    assert first.handle == 0
    server.answer_attach(first, source=first.remote_source, target=first.remote_target)
    server.data_to_send()
    events, out = server_frames_after(
        server, raw(0, Attach(name="b", handle=1, role=ROLE_SENDER, initial_delivery_count=0))
    )
    assert violation(events, out) == errors.NOT_ALLOWED
    # and our own attach beyond the peer's handle-max is refused locally, not sent
    _, server = opened_pair()
    server.receive_data(raw(0, Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9,
                                     handle_max=0)))  # fmt: skip
    (session,) = server.sessions.values()
    server.attach(session, name="a", role=ROLE_RECEIVER, source=Source(), target=Target())
    with pytest.raises(LocalProtocolError) as exc:
        server.attach(session, name="b", role=ROLE_RECEIVER, source=Source(), target=Target())
    assert exc.value.condition == errors.RESOURCE_LIMIT_EXCEEDED


def test_past_max_links_the_engine_refuses_a_new_link_itself() -> None:
    _, server = opened_pair(max_links=2)
    server.receive_data(raw(0, Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9)))
    server.data_to_send()
    for handle, name in enumerate("ab"):
        link = attach_sender(server, handle=handle, name=name)
        server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.data_to_send()
    events, out = server_frames_after(
        server, raw(0, Attach(name="c", handle=2, role=ROLE_SENDER, initial_delivery_count=0))
    )
    assert not of(events, LinkAttachRequested)  # never offered to the layer above
    (attach,) = [f for f in out if isinstance(f, Attach)]
    (detach,) = [f for f in out if isinstance(f, Detach)]
    assert out.index(attach) < out.index(detach)
    assert attach.name == "c" and attach.target is None  # a null terminus: never created
    assert detach.closed and detach.error is not None
    assert detach.error.condition == errors.RESOURCE_LIMIT_EXCEEDED
    assert not of(events, ProtocolViolation)  # the connection goes on


# -- incomplete incoming messages, per connection ------------------------------------------


def _attached_senders(server_cfg: dict[str, int], count: int) -> Connection:
    """A server with ``count`` sender links of the peer's attached, each with credit 10."""
    _, server = opened_pair(**server_cfg)
    begun(server)
    for handle in range(count):
        link = attach_sender(server, handle=handle, name=f"l{handle}")
        server.answer_attach(link, source=link.remote_source, target=link.remote_target)
        server.flow(link, 10)
    server.data_to_send()
    return server


def _part(handle: int, delivery_id: int | None, size: int, *, more: bool = True) -> bytes:
    tag = None if delivery_id is None else b"t%d" % delivery_id
    transfer = Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=tag, more=more)
    return raw(0, transfer, b"x" * size)


def test_incomplete_messages_are_bounded_per_connection() -> None:
    """8 links each starting a message that never ends held +461 MiB: now the link whose
    frame would take the connection past ``max_incomplete_bytes`` is detached with
    resource-limit-exceeded and its bytes are freed; the others go on."""
    server = _attached_senders({"max_incomplete_bytes": 10_000}, 3)
    server.receive_data(_part(0, 0, 6000) + _part(1, 1, 3000))
    assert server.input_size == 9000
    events, out = server_frames_after(server, _part(2, 2, 2000))
    (detach,) = [f for f in out if isinstance(f, Detach)]
    assert detach.handle == 2 and detach.closed and detach.error is not None
    assert detach.error.condition == errors.RESOURCE_LIMIT_EXCEEDED
    assert server.input_size == 9000
    # the first message completes (its last frame needs no room), freeing its bytes
    events = server.receive_data(_part(0, None, 500, more=False))
    (done,) = of(events, MessageReceived)
    assert len(done.payload) == 6500 and server.input_size == 3000
    # a link that goes away frees what it held
    events = server.receive_data(raw(0, Detach(handle=1, closed=True)))
    assert of(events, LinkDetached) and server.input_size == 0


def test_tiny_frames_cannot_hold_more_memory_than_the_bytes_they_carry() -> None:
    server = _attached_senders({"max_incomplete_bytes": 4000}, 1)
    burst = _part(0, 0, 1) + b"".join(_part(0, None, 1) for _ in range(2999))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        server.receive_data(burst)
        server.receive_data(HEARTBEAT)  # (the next read lets go of the input parsed)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert server.input_size == 3000
    assert held < 16 * 1024  # one growing buffer, not 3,000 objects of ~50 bytes each


# -- values decoded per frame or message ----------------------------------------------------


def _described_array(count: int) -> bytes:
    """An amqp-value array of ``count`` 2-byte described elements (descriptor once, then one
    ubyte each): the issue's 8 MiB body became +696 MiB and 6.7 s of decoding."""
    body = b"\x00\xa3\x01x" + b"\x50" + b"\x07" * count
    return b"\x00\x53\x77\xf0" + struct.pack(">II", len(body) + 4, count) + body


def test_a_message_of_too_many_values_is_refused_before_it_costs_anything() -> None:
    payload = _described_array(8 * 2**20)
    tracemalloc.start()
    try:
        started = time.process_time()
        with pytest.raises(DecodeError) as info:
            Message.decode(payload)
        spent = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.condition == errors.DECODE_ERROR
    assert str(MAX_ELEMENTS) in info.value.description
    assert peak < 2**20 and spent < 0.1  # refused at the array's header: nothing was built


def test_the_value_budget_is_shared_by_a_message_and_all_its_sections() -> None:
    ok = Message.decode(_described_array(MAX_ELEMENTS // 2))
    assert len(ok.body) == MAX_ELEMENTS // 2  # each element: a value and its Described
    with pytest.raises(DecodeError):
        Message.decode(_described_array(MAX_ELEMENTS // 2 + 1))
    # small lists, each well under the bound, add up: 3 sections of 50,000 values
    section = Message(body=[[0] * 50_000], body_kind="sequence").encode()
    assert Message.decode(section).body == [[0] * 50_000]
    with pytest.raises(DecodeError):
        Message.decode(section * 3)  # (amqp-sequence sections may repeat)
    nested = encode([[0, 0]] * 50_000)  # 150,000 values in lists of two
    with pytest.raises(DecodeError):
        decode(nested)
    assert len(decode(nested, max_elements=150_000)) == 50_000
    with pytest.raises(DecodeError):
        Message.decode(b"\x00\x53\x77" + nested, max_elements=149_999)


def test_a_frame_of_too_many_values_closes_the_connection_with_decode_error() -> None:
    _, server = opened_pair(max_decoded_elements=100)
    begun(server)
    properties = {Symbol(f"k{i}"): i for i in range(60)}  # 120 values
    attach = Attach(
        name="x", handle=0, role=ROLE_SENDER, initial_delivery_count=0, properties=properties
    )
    events, out = server_frames_after(server, raw(0, attach))
    assert not of(events, LinkAttachRequested)
    assert violation(events, out) == errors.DECODE_ERROR


# -- unsettled deliveries, per link ---------------------------------------------------------


def test_a_sender_at_max_unsettled_has_no_usable_credit_until_the_peer_settles() -> None:
    client, server = opened_pair()
    client.config.max_unsettled = 3
    sender, receiver = linked(client, server, credit=10)
    assert (sender.usable_credit, sender.send_blocked) == (3, False)
    for _ in range(3):
        client.send(sender, VALUE)
    assert (sender.unsettled, sender.link_credit, sender.usable_credit) == (3, 7, 0)
    assert sender.send_blocked
    with pytest.raises(LocalProtocolError) as exc:
        client.send(sender, VALUE)
    assert exc.value.condition == errors.RESOURCE_LIMIT_EXCEEDED
    client.send(sender, VALUE, settled=True)  # a pre-settled one needs only credit
    _, ev = pump(client, server)
    received = of(ev, MessageReceived)
    assert len(received) == 4 and receiver.unsettled == 3
    server.settle(received[0].delivery, Accepted())
    ev, _ = pump(client, server)
    assert of(ev, DeliveryUpdated) and receiver.unsettled == 2
    assert (sender.unsettled, sender.usable_credit, sender.send_blocked) == (2, 1, False)


def test_a_peer_sending_past_our_max_unsettled_has_its_link_detached() -> None:
    client, server = opened_pair(max_unsettled=2)
    sender, receiver = linked(client, server, credit=10)
    assert receiver.max_unsettled == 2
    for settled in (False, False, True, False):  # the pre-settled one is held by nobody
        client.send(sender, VALUE, settled=settled)
    _, ev = pump(client, server)
    assert len(of(ev, MessageReceived)) == 3
    (detached,) = of(ev, LinkDetached)
    assert detached.link is receiver and not detached.by_peer
    assert detached.error.condition == errors.RESOURCE_LIMIT_EXCEEDED
    assert "at most 2" in detached.error.description
    assert receiver.unsettled == 0 and not server.sessions[0].unsettled_in
    assert not server.closed  # a link's breach ends the link, not the connection
    assert frames(server.data_to_send()) == []
