"""Every field a peer sends is checked against its type in the spec when it is decoded: a frame
with a value of the wrong type closes the connection with ``amqp:decode-error``, a value the
field's type does not allow with ``amqp:invalid-field``; a message with either is a
``DecodeError`` (the service rejects it). What is accepted encodes again, and the legal but
unusual forms of a field are read, not refused."""

from __future__ import annotations

import pytest

from pairlink._amqp import errors
from pairlink._amqp.codec import encode
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.events import LinkAttachRequested, MessageReceived
from pairlink._amqp.messaging import Error, Message, Source
from pairlink._amqp.performatives import Attach, Transfer
from pairlink._amqp.types import Array, Described, Symbol, UByte, UInt, ULong
from tests.amqp.engine_peer import (
    attach_sender,
    begun,
    composite,
    frame,
    frames,
    of,
    opened_pair,
    raw,
    server_frames_after,
    violation,
)

NULL = b"\x40"


def attach(
    *,
    source: bytes = NULL,
    target: bytes = NULL,
    snd_settle_mode: bytes = NULL,
    capabilities: bytes = NULL,
    properties: bytes = NULL,
) -> bytes:
    """A sender's attach (name "l", handle 0) with the given encoded fields."""
    return composite(
        0x12, encode("l"), encode(UInt(0)), encode(False), snd_settle_mode, NULL, source,
        target, NULL, NULL, encode(UInt(0)), NULL, capabilities, NULL, properties,
    )  # fmt: skip


BYTE_DESCRIBED = b"\x00\x51\xff" + encode("a")  # a descriptor of type byte: it cannot encode


@pytest.mark.parametrize(
    ("body", "condition"),
    [
        (attach(source=encode(UInt(5))), errors.DECODE_ERROR),  # a uint where a source goes
        (attach(target=encode(Source(address="x"))), errors.DECODE_ERROR),  # a source as target
        (attach(target=encode(Described(Symbol("x:y"), 1))), errors.DECODE_ERROR),
        (attach(target=composite(0x29, encode(UInt(5)))), errors.DECODE_ERROR),  # address uint
        (attach(target=composite(0x29, BYTE_DESCRIBED)), errors.DECODE_ERROR),
        (attach(properties=b"\xc1\x05\x02" + BYTE_DESCRIBED[:3] + NULL), errors.DECODE_ERROR),
        (attach(properties=encode({1: True})), errors.DECODE_ERROR),  # key not a symbol
        (attach(properties=encode({"é": True})), errors.DECODE_ERROR),  # no symbol is "é"
        (attach(capabilities=encode([Symbol("a"), 1])), errors.DECODE_ERROR),
        (attach(snd_settle_mode=encode(UByte(7))), errors.INVALID_FIELD),  # modes are 0..2
        (attach(source=composite(0x28, NULL, NULL, encode(Symbol("forever")))),
         errors.INVALID_FIELD),  # an expiry policy the spec does not list
        (composite(0x16, encode(UInt(0)), NULL, encode(UInt(5))), errors.DECODE_ERROR),  # detach
        (composite(0x15, encode(True), encode(UInt(0)), NULL, NULL, encode(Error("x"))),
         errors.DECODE_ERROR),  # a disposition whose state is an error
        (composite(0x18, encode(Source())), errors.DECODE_ERROR),  # a close whose error is not
    ],
    ids=["source-uint", "target-source", "target-unknown", "address-uint", "address-byte-desc",
         "descriptor-byte", "key-long", "key-not-ascii", "capability-long", "settle-mode-7",
         "expiry-forever", "detach-error-uint", "disposition-state-error", "close-error-source"],
)  # fmt: skip
def test_a_field_of_the_wrong_type_or_value_closes_the_connection(
    body: bytes, condition: str
) -> None:
    _, server = opened_pair()
    begun(server)
    events, out = server_frames_after(server, frame(0, body))
    assert not of(events, LinkAttachRequested)  # the engine's user never sees such a frame
    assert violation(events, out) == condition
    assert server.transport_done


@pytest.mark.parametrize(
    "capabilities",
    [encode(Symbol("a")), encode(Array([Symbol("a"), Symbol("b")])),
     encode([Symbol("a"), Symbol("b")]), encode([])],
    ids=["single", "array", "list", "empty-list"],
)  # fmt: skip
def test_capabilities_are_read_in_every_form_and_answered_as_an_array(
    capabilities: bytes,
) -> None:
    _, server = opened_pair()
    begun(server)
    # liberal in what we read: a string key where the spec wants a symbol is that symbol
    events = server.receive_data(
        frame(0, attach(capabilities=capabilities, properties=encode({"paired": True})))
    )
    (req,) = of(events, LinkAttachRequested)
    link = req.link
    offered = link.remote_attach.offered_capabilities
    assert offered == {1: ["a"], 2: ["a", "b"]}.get(len(offered), [])
    assert link.remote_properties == {Symbol("paired"): True}
    server.answer_attach(
        link, source=link.remote_source, target=link.remote_target,
        properties=link.remote_properties, offered_capabilities=offered,
    )  # fmt: skip
    (answer,) = frames(server.data_to_send())
    assert isinstance(answer, Attach)
    assert list(answer.offered_capabilities or ()) == offered
    assert answer.properties == {"paired": True}


def test_a_delivery_tag_over_32_bytes_is_an_invalid_field() -> None:
    _, server = opened_pair()
    begun(server)
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.flow(link, 10)
    server.data_to_send()
    ok = raw(0, Transfer(handle=0, delivery_id=0, delivery_tag=b"t" * 32), b"\x00Sw\x40")
    assert of(server.receive_data(ok), MessageReceived)
    server.data_to_send()
    long_tag = raw(0, Transfer(handle=0, delivery_id=1, delivery_tag=b"t" * 33), b"\x00Sw\x40")
    events, out = server_frames_after(server, long_tag)
    assert violation(events, out) == errors.INVALID_FIELD
    assert "33 bytes" in out[-1].error.description


def _properties(*fields: bytes) -> bytes:
    return composite(0x73, *fields) + encode(Described(0x77, None))


@pytest.mark.parametrize(
    ("payload", "condition"),
    [
        (_properties(encode(-5)), errors.DECODE_ERROR),  # a long cannot be a message-id
        (_properties(encode(UInt(5))), errors.DECODE_ERROR),  # a uint neither (ulong can)
        (_properties(encode([1])), errors.DECODE_ERROR),  # nor a list
        (_properties(NULL, NULL, encode(UInt(5))), errors.DECODE_ERROR),  # to: not a string
        (_properties(NULL, NULL, NULL, NULL, BYTE_DESCRIBED), errors.DECODE_ERROR),  # reply-to
        (encode(Described(0x77, Described(0x1D, []))), errors.INVALID_FIELD),  # error, no cond.
        (encode(Described(0x77, Described(UInt(5), 1)))[:4] + b"\x00\x52\x05\x41",
         errors.DECODE_ERROR),  # a described value whose descriptor is a uint
    ],
    ids=["id-long", "id-uint", "id-list", "to-uint", "reply-to-byte-desc", "error-no-condition",
         "descriptor-uint"],
)  # fmt: skip
def test_a_message_with_a_field_the_spec_does_not_allow_is_a_decode_error(
    payload: bytes, condition: str
) -> None:
    # A DecodeError whatever the reason, so the layer above rejects the message; before, some
    # of these decoded and failed later (a reply could not encode the correlation-id).
    with pytest.raises(DecodeError) as info:
        Message.decode(payload)
    assert info.value.condition == condition


def test_a_message_with_legal_fields_decodes_and_encodes_again() -> None:
    payload = _properties(encode(ULong(7)), NULL, encode("to"), NULL, encode("$me"))
    msg = Message.decode(payload)
    assert msg.properties is not None
    assert (msg.properties.message_id, msg.properties.to, msg.properties.reply_to) == (
        7, "to", "$me",
    )  # fmt: skip
    assert Message.decode(msg.encode()) == msg
