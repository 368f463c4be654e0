"""The call layouts (``pairlink._amqp.call_layout``): what each writer writes is what the generic
encoder writes for the same section, and its reader reads back exactly what was written; and
the fast-path registry switches a reader off, or records it, and puts it back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairlink._amqp.call_layout import (
    PROPERTIES_HEAD,
    address_fields,
    read_reply_properties,
    read_usual_request,
    usual_request_parts,
    write_reply_properties,
    write_request_properties,
    write_usual_request,
)
from pairlink._amqp.codec import encode
from pairlink._amqp.fast_paths import FAST_PATHS, register
from pairlink._amqp.messaging import Header, Message, Properties
from pairlink._amqp.types import Symbol, ULong
from pairlink._rpc import wire

ids = st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=40))
MSGPACK = encode(Symbol("application/msgpack"))


def _generic_properties(**fields: Any) -> bytes:
    return encode(Properties(**fields))


@given(ids, st.one_of(st.none(), st.text(max_size=300)), st.booleans())
def test_reply_properties_are_the_generic_encoders_and_read_back(
    correlation_id: Any, to: str | None, typed: bool
) -> None:
    content = MSGPACK if typed else b""
    out = bytearray()
    write_reply_properties(out, to, correlation_id, content)
    wanted = ULong(correlation_id) if type(correlation_id) is int else correlation_id
    generic = _generic_properties(
        to=to,
        correlation_id=wanted,
        content_type=Symbol("application/msgpack") if typed else None,
    )
    assert bytes(out) == generic
    read = read_reply_properties(bytes(out), MSGPACK)
    if typed and len(out) <= 0xFF + 5:  # a list8 with its content-type: the one it reads
        assert read == (correlation_id, to, len(out))
    else:
        assert read is None


@given(ids, st.one_of(st.none(), st.text(max_size=60)), st.integers(-(2**40), 2**40))
def test_request_properties_are_the_generic_encoders(
    message_id: Any, reply_to: str | None, expiry_ms: int
) -> None:
    out = bytearray()
    write_request_properties(out, message_id, address_fields(reply_to), MSGPACK, expiry_ms)
    message = Message.decode(bytes(out))
    assert message.properties is not None
    assert message.properties.message_id == message_id
    assert message.properties.correlation_id == message_id
    assert message.properties.reply_to == reply_to
    assert message.properties.content_type == "application/msgpack"
    assert message.properties.absolute_expiry_time is not None


@given(st.integers(256, 2**32 - 1), st.integers(256, 2**64 - 1), st.integers(0, 2**45))
def test_the_usual_request_is_read_back_field_for_field(
    ttl: int, message_id: int, expiry_ms: int
) -> None:
    parts = usual_request_parts(encode(Header(ttl=ttl)), address_fields("$me"), MSGPACK)
    head = write_usual_request(parts, message_id, expiry_ms)
    general = bytearray(encode(Header(ttl=ttl)))
    write_request_properties(general, message_id, address_fields("$me"), MSGPACK, expiry_ms)
    assert head == general
    usual = read_usual_request(bytes(head))
    assert usual is not None
    assert (usual.ttl, usual.message_id, usual.reply_to) == (ttl, message_id, "$me")
    assert (usual.expiry_ms, usual.sections) == (expiry_ms, len(head))
    assert usual.content_type == "application/msgpack"
    assert head.startswith(encode(Header(ttl=ttl)) + PROPERTIES_HEAD[:3])


def test_every_fast_path_is_registered_by_name() -> None:
    assert {"usual-message", "request", "reply"} <= set(FAST_PATHS)
    assert FAST_PATHS["request"] is wire.REQUEST


def test_a_fast_path_switched_off_declines_and_comes_back() -> None:
    payload = wire.encode_request("echo", (1,), {}, message_id=300, now=1.7e9, timeout=30.0)
    assert wire.REQUEST.read(payload) is not None
    with wire.REQUEST.off():
        assert wire.REQUEST.read(payload) is None
        with wire.REQUEST.recorded() as taken:  # records the reader, not the stand-in
            assert wire.REQUEST.read(payload) is not None
            assert wire.REQUEST.read(b"junk") is None
        assert taken == [True, False]
        assert wire.REQUEST.read(payload) is None
    with pytest.raises(RuntimeError), wire.REQUEST.off():
        raise RuntimeError
    assert wire.REQUEST.read is wire.REQUEST.reader


def test_two_fast_paths_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two fast paths named 'reply'"):
        register("reply", lambda payload: None)
