"""What an intermediary (a gateway) may change in a message it relays: the header's ttl only."""

from __future__ import annotations

from pairlink._amqp.messaging import (
    Header,
    Message,
    Properties,
    bare_message_span,
    with_ttl_reduced,
)


def _message(header: Header | None) -> bytes:
    return Message(
        header=header,
        properties=Properties(message_id=7, reply_to="$me", to="billing"),
        application_properties={"operation": "echo"},
        body=b"payload",
        body_kind="data",
    ).encode()


def _bare(payload: bytes) -> bytes:
    start, end = bare_message_span(payload)
    return payload[start:end]


def test_time_spent_in_the_gateway_is_taken_off_the_ttl_and_the_bare_message_is_untouched() -> None:
    original = _message(Header(ttl=5000, priority=7, delivery_count=2))
    relayed = with_ttl_reduced(original, 120)
    header = Message.decode(relayed).header
    assert header is not None
    assert (header.ttl, header.priority, header.delivery_count) == (4880, 7, 2)
    assert _bare(relayed) == _bare(original)


def test_a_ttl_is_never_cut_to_zero_or_below() -> None:
    # expiring the message is the receiver's call, with the deadline the bare message carries
    header = Message.decode(with_ttl_reduced(_message(Header(ttl=50)), 400)).header
    assert header is not None and header.ttl == 1


def test_nothing_to_cut_leaves_the_very_same_bytes() -> None:
    without_header = _message(None)
    without_ttl = _message(Header(durable=True))
    with_ttl = _message(Header(ttl=1000))
    assert with_ttl_reduced(without_header, 500) is without_header
    assert with_ttl_reduced(without_ttl, 500) is without_ttl
    assert with_ttl_reduced(with_ttl, 0) is with_ttl
