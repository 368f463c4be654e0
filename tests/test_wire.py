"""The wire conventions of a call: request and reply messages, bodies, deadlines, statuses."""

from __future__ import annotations

import concurrent.futures
import datetime
import json
from typing import Any

import msgpack
import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairlink._amqp.messaging import Header, Message, Properties
from pairlink._amqp.types import ULong
from pairlink._rpc.payload import Encoding, decode_value, encoded_body, set_body, split_arguments
from pairlink._rpc.wire import (
    BAD_REQUEST,
    ERROR_TYPE,
    INTERNAL_ERROR,
    ME,
    OPERATION,
    STATUS_CODE,
    TIMEOUT,
    Request,
    encode_reply,
    encode_request,
    error_message,
    parse_reply,
    parse_request,
    reply_message,
    request_message,
    with_status,
)
from pairlink.errors import CallError, PayloadError, RemoteError

NOW = 1_800_000_000.0


def roundtrip(message: Message) -> Message:
    return Message.decode(message.encode())


def test_request_carries_operation_id_reply_to_and_both_deadline_forms() -> None:
    msg = roundtrip(request_message("add", (1, 2), {"c": 3}, message_id=7, now=NOW, timeout=2.5))
    assert msg.application_properties == {OPERATION: "add"}
    assert msg.properties is not None
    assert msg.properties.message_id == 7 and msg.properties.reply_to == ME
    assert msg.properties.content_type == Encoding.ENVELOPE.value
    assert msg.header is not None and msg.header.ttl == 2500
    expiry = msg.properties.absolute_expiry_time
    assert expiry == datetime.datetime.fromtimestamp(NOW + 2.5, datetime.UTC)
    request = parse_request(msg, now=NOW + 100)  # the absolute time wins over ttl
    assert (request.operation, request.args, request.kwargs) == ("add", [1, 2], {"c": 3})
    assert request.deadline == pytest.approx(NOW + 2.5)


def test_ttl_alone_counts_from_arrival() -> None:
    msg = Message(
        header=Header(ttl=1500),
        properties=Properties(message_id="x"),
        application_properties={OPERATION: "op"},
        body=[1],
    )
    assert parse_request(roundtrip(msg), now=NOW).deadline == pytest.approx(NOW + 1.5)


def test_subject_names_the_operation_when_application_properties_do_not() -> None:
    msg = Message(properties=Properties(message_id=1, subject="ping"), body=None)
    request = parse_request(roundtrip(msg), now=NOW)
    assert request.operation == "ping" and request.args == [] and request.kwargs == {}


@pytest.mark.parametrize(
    ("value", "args", "kwargs"),
    [([1, "a"], [1, "a"], {}), ({"x": 1}, [], {"x": 1}), ("one", ["one"], {}), (None, [], {})],
)
def test_amqp_value_bodies_as_a_proton_client_sends_them(
    value: Any, args: list[Any], kwargs: dict[str, Any]
) -> None:
    pm = proton.Message(body=value, id="p1", reply_to=ME, properties={OPERATION: "op"})
    request = parse_request(Message.decode(pm.encode()), now=NOW)
    assert (request.args, request.kwargs, request.encoding) == (args, kwargs, Encoding.AMQP_VALUE)
    reply = roundtrip(reply_message(request, {"ok": True}, to=ME))
    assert reply.body_kind == "value" and reply.body == {"ok": True}
    back = proton.Message()
    back.decode(reply.encode())
    assert back.correlation_id == "p1" and back.address == ME
    props: Any = back.properties  # proton's annotations say None here
    assert props[STATUS_CODE] == 200
    assert back.body == {"ok": True}


@pytest.mark.parametrize(
    ("content_type", "data", "args", "kwargs"),
    [
        ("application/json", json.dumps([1, 2]).encode(), [1, 2], {}),
        ("application/json", json.dumps({"a": 1}).encode(), [], {"a": 1}),
        ("application/msgpack", msgpack.packb(["x"]), ["x"], {}),
        ("application/octet-stream", b"\x00raw", [b"\x00raw"], {}),
        (None, b"raw", [b"raw"], {}),
    ],
)
def test_data_bodies_by_content_type(
    content_type: str | None, data: bytes, args: list[Any], kwargs: dict[str, Any]
) -> None:
    msg = Message(
        properties=Properties(message_id=1, content_type=content_type),
        application_properties={OPERATION: "op"},
        body=data,
        body_kind="data",
    )
    request = parse_request(roundtrip(msg), now=NOW)
    assert (request.args, request.kwargs) == (args, kwargs)
    reply = roundtrip(reply_message(request, args[0] if args else kwargs, to=None))
    assert parse_reply(reply) == (args[0] if args else kwargs)


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("application/json", b"{nope"),
        ("application/msgpack", b"\xc1"),
        ("application/x-pairlink-call+msgpack", msgpack.packb([1, 2, 3])),
        ("application/x-pairlink-call+msgpack", msgpack.packb([[], {1: 2}])),
    ],
)
def test_undecodable_bodies_are_a_400(content_type: str, data: bytes) -> None:
    msg = Message(
        properties=Properties(message_id=1, content_type=content_type),
        application_properties={OPERATION: "op"},
        body=data,
        body_kind="data",
    )
    with pytest.raises(CallError) as exc:
        parse_request(roundtrip(msg), now=NOW)
    assert exc.value.status == BAD_REQUEST


def test_a_request_without_operation_is_a_400() -> None:
    with pytest.raises(CallError) as exc:
        parse_request(Message(properties=Properties(message_id=1), body=[]), now=NOW)
    assert exc.value.status == BAD_REQUEST


def test_error_reply_raises_remote_error_with_type_status_and_message() -> None:
    request = parse_request(
        roundtrip(request_message("op", (), {}, message_id=5, now=NOW)), now=NOW
    )
    reply = roundtrip(
        error_message(request, INTERNAL_ERROR, "boom", to=ME, error_type="ValueError")
    )
    assert reply.properties is not None and reply.properties.correlation_id == 5
    assert reply.application_properties is not None
    assert reply.application_properties[ERROR_TYPE] == "ValueError"
    with pytest.raises(RemoteError) as exc:
        parse_reply(reply)
    assert (exc.value.status, exc.value.type, exc.value.message) == (500, "ValueError", "boom")


def test_a_408_reply_is_both_a_remote_error_and_a_timeout() -> None:
    request = parse_request(
        roundtrip(request_message("op", (), {}, message_id=6, now=NOW)), now=NOW
    )
    reply = roundtrip(error_message(request, TIMEOUT, "deadline passed", to=ME))
    with pytest.raises(TimeoutError) as exc:
        parse_reply(reply)
    assert isinstance(exc.value, RemoteError) and exc.value.status == TIMEOUT


def test_envelope_request_gets_a_plain_msgpack_reply() -> None:
    request = parse_request(
        roundtrip(request_message("op", (b"\x00", "s"), {}, message_id=1, now=NOW)), now=NOW
    )
    assert request.args == [b"\x00", "s"]  # bytes and str stay apart
    reply = roundtrip(reply_message(request, [b"\x01", "t"], to=ME))
    assert reply.properties is not None and reply.properties.content_type == "application/msgpack"
    assert parse_reply(reply) == [b"\x01", "t"]


def test_encodings_that_cannot_carry_both_kinds_of_arguments_say_so() -> None:
    with pytest.raises(PayloadError):
        request_message("op", (1,), {"a": 2}, message_id=1, now=NOW, encoding=Encoding.JSON)
    with pytest.raises(PayloadError):
        set_body(Message(), "not bytes", Encoding.RAW)
    with pytest.raises(PayloadError):
        split_arguments({1: "x"}, Encoding.MSGPACK)


def test_decode_value_of_a_multi_section_sequence_body() -> None:
    msg = Message(body=[[1, 2], [3]], body_kind="sequence")
    assert decode_value(roundtrip(msg)) == ([1, 2, 3], Encoding.AMQP_VALUE)


@pytest.mark.parametrize(
    ("encoding", "args", "kwargs"),
    [
        (Encoding.ENVELOPE, ("x", b"\x00"), {"k": [1]}),
        (Encoding.MSGPACK, (1, 2), {}),
        (Encoding.JSON, (), {"a": 1}),
        (Encoding.AMQP_VALUE, ([1], {"m": None}), {}),
    ],
)
@pytest.mark.parametrize("timeout", [None, 2.5])
def test_encode_request_writes_the_bytes_of_request_message(
    encoding: Encoding, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> None:
    """The client's fast path (no Message built, the operation's section cached) must say
    exactly what ``request_message`` says."""
    for operation, message_id in (("op", 7), ("op", "id-2"), ("other", 2**40)):
        options: Any = {"message_id": message_id, "now": NOW, "timeout": timeout}
        expected = request_message(operation, args, kwargs, encoding=encoding, **options)
        assert encode_request(operation, args, kwargs, encoding=encoding, **options) == (
            expected.encode()
        )


@pytest.mark.parametrize(
    ("encoding", "value"),
    [
        (Encoding.ENVELOPE, {"ok": [1, "two"]}),
        (Encoding.MSGPACK, b"\x00bytes"),
        (Encoding.JSON, {"a": [1]}),
        (Encoding.AMQP_VALUE, None),
        (Encoding.RAW, b"raw"),
    ],
)
@pytest.mark.parametrize("to", [ME, None])
def test_encode_reply_writes_the_bytes_of_reply_message(
    encoding: Encoding, value: Any, to: str | None
) -> None:
    """The service's fast path (the success status encoded once) must say exactly what
    ``reply_message`` says, in every encoding a request can come in."""
    request = Request("op", [], {}, 3, ME, encoding, None, Message())
    assert encode_reply(request, value, to=to) == reply_message(request, value, to=to).encode()


def test_the_fast_paths_refuse_what_the_messages_refuse() -> None:
    raw = Request("op", [], {}, 3, ME, Encoding.RAW, None, Message())
    with pytest.raises(PayloadError):
        encode_reply(raw, "not bytes", to=ME)
    with pytest.raises(PayloadError):
        encode_request("op", ("text",), {}, message_id=1, now=NOW, encoding=Encoding.RAW)
    with pytest.raises(PayloadError):
        encode_request("op", (1,), {"a": 2}, message_id=1, now=NOW, encoding=Encoding.JSON)


MESSAGE_IDS = st.one_of(
    st.none(), st.text(max_size=300), st.integers(0, 2**64 - 1), st.binary(max_size=300),
    st.uuids(), st.builds(ULong, st.integers(0, 2**64 - 1)),
)  # fmt: skip
ADDRESSES = st.one_of(st.none(), st.text(max_size=300))


@settings(max_examples=400, deadline=None)
@given(
    message_id=MESSAGE_IDS,
    reply_to=ADDRESSES,
    timeout=st.one_of(st.none(), st.floats(-10, 1e6)),
    encoding=st.sampled_from(Encoding),
    headers=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.text(), max_size=2)),
)
def test_encode_request_writes_the_bytes_the_codec_writes(
    message_id: Any,
    reply_to: str | None,
    timeout: float | None,
    encoding: Encoding,
    headers: dict[str, str] | None,
) -> None:
    """Every id type and size (list8 and list32 properties), with and without a deadline, a
    reply-to or headers: the request's bytes are the ``Message``'s, and decode back to it."""
    args = (b"\x01",) if encoding in (Encoding.RAW, Encoding.BATCH) else ("x",)
    options: Any = {"message_id": message_id, "now": NOW, "timeout": timeout}
    expected = request_message("op", args, {}, reply_to=reply_to, encoding=encoding, **options)
    if headers:
        expected.application_properties = {**headers, OPERATION: "op"}
    got = encode_request(
        "op", args, {}, reply_to=reply_to, encoding=encoding, headers=headers, **options
    )
    assert got == expected.encode()
    props = Message.decode(got).properties
    assert props is not None and (props.message_id, props.reply_to) == (message_id, reply_to)


@settings(max_examples=400, deadline=None)
@given(
    message_id=MESSAGE_IDS,
    to=ADDRESSES,
    encoding=st.sampled_from(Encoding),
    extra=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.integers(0, 9), max_size=2)),
)
def test_encode_reply_writes_the_bytes_the_codec_writes(
    message_id: Any, to: str | None, encoding: Encoding, extra: dict[str, Any] | None
) -> None:
    """Every correlation-id type and size, with and without a ``to`` or extra properties."""
    request = Request("op", [], {}, message_id, ME, encoding, None, Message())
    value = b"\x02" if encoding is Encoding.RAW else "y"
    expected = reply_message(request, value, to=to)
    if extra:
        expected.application_properties = with_status(extra, 200, "OK")
    got = encode_reply(request, value, to=to, extra=extra)
    assert got == expected.encode()
    props = Message.decode(got).properties
    assert props is not None and (props.correlation_id, props.to) == (message_id, to)


@pytest.mark.parametrize(
    "timeout",
    [2.6e11, -1e11, 253_402_300_799.0, 4e6, -62_135_596_800.0, -62_135_596_800.5, 1e30],
)
def test_deadlines_near_the_datetime_bounds_encode_or_fail_as_the_message_does(
    timeout: float,
) -> None:
    """The request's expiry is computed without a datetime: the same milliseconds, and the
    same error where the datetime would not exist or the ttl is no uint."""

    def outcome(encode: Any) -> Any:
        try:
            return encode()
        except (OverflowError, ValueError) as exc:
            return type(exc), str(exc)

    options: Any = {"message_id": "id", "now": 0.0, "timeout": timeout}
    ours = outcome(lambda: encode_request("op", (), {}, **options))
    theirs = outcome(lambda: request_message("op", (), {}, **options).encode())
    assert ours == theirs


def test_a_value_that_does_not_pack_leaves_nothing_behind_for_the_next() -> None:
    """Each thread packs with one reused packer: a value that fails half-way (a 400 or 500
    for its call) must not leave bytes in it for the next call's value."""
    good = [[b"\x00" * 64, "é"], {"k": None}]
    unpackable: list[Any] = [[1, 2, object()], [b"x" * 100, 2**70], {"a": {1: set()}}]
    for bad in unpackable:
        with pytest.raises(PayloadError):
            encoded_body(bad, Encoding.MSGPACK)
        assert encoded_body(good, Encoding.MSGPACK)[0] == msgpack.packb(good, use_bin_type=True)


def test_threads_packing_at_once_each_get_their_own_bytes() -> None:
    def pack_many(n: int) -> list[bool]:
        values = [[n, i, b"y" * (i % 300)] for i in range(2000)]
        return [
            encoded_body(v, Encoding.MSGPACK)[0] == msgpack.packb(v, use_bin_type=True)
            for v in values
        ]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(pack_many, range(8)))
    assert all(all(r) for r in results) and len(results) == 8
