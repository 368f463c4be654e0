"""Message: section order, body kinds, the bare-message span, and Proton's Message both ways."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairlink._amqp import messaging
from pairlink._amqp.codec import MAX_DEPTH, encode
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.messaging import (
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    Message,
    MessageAnnotations,
    Properties,
    bare_message_span,
    decode_head,
)
from pairlink._amqp.performatives import Open
from pairlink._amqp.types import Described, Symbol, UInt, ULong

S = Symbol
T0 = datetime.datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=datetime.UTC)

HEADER = Header(durable=True, priority=7, ttl=30000, first_acquirer=True, delivery_count=2)
PROPS = Properties(
    message_id=uuid.UUID(int=42), user_id=b"alice", to="svc/add", subject="add",
    reply_to="$me", correlation_id=ULong(9), content_type=S("application/msgpack"),
    content_encoding=S("gzip"), absolute_expiry_time=T0, creation_time=T0, group_id="g",
    group_sequence=3, reply_to_group_id="rg",
)  # fmt: skip
ANNOTATED: dict[str, Any] = {
    "header": HEADER,
    "delivery_annotations": {S("x-opt-da"): 1},
    "message_annotations": {S("x-opt-ma"): "m", ULong(3): True},
    "properties": PROPS,
    "application_properties": {"operation": "add", "n": UInt(2)},
    "footer": {S("x-opt-sig"): b"\x01" * 8},
}
BODIES: list[tuple[str, Any]] = [
    ("value", None),
    ("value", "text"),
    ("value", {"a": [1, 2.5, None]}),
    ("data", b""),
    ("data", b"\x00" * 1000),
    ("data", [b"one", b"two", b"\xff" * 300]),
    ("sequence", [[1, "x"]]),
    ("sequence", [[1], [], ["three", None]]),
]


@pytest.mark.parametrize(("kind", "body"), BODIES)
@pytest.mark.parametrize("annotated", [False, True])
def test_round_trip(kind: Any, body: Any, annotated: bool) -> None:
    msg = Message(body=body, body_kind=kind, **(ANNOTATED if annotated else {}))
    encoded = msg.encode()
    assert Message.decode(encoded) == msg
    assert Message.decode(memoryview(encoded)) == msg
    assert Message.decode(encoded).encode() == encoded


def test_sections_are_written_in_spec_order() -> None:
    msg = Message(body=[b"a", b"b"], body_kind="data", **ANNOTATED)
    expected = b"".join(
        encode(x)
        for x in (
            HEADER,
            DeliveryAnnotations(ANNOTATED["delivery_annotations"]),
            MessageAnnotations(ANNOTATED["message_annotations"]),
            PROPS,
            ApplicationProperties(ANNOTATED["application_properties"]),
            Data(b"a"),
            Data(b"b"),
            Footer(ANNOTATED["footer"]),
        )
    )
    assert msg.encode() == expected


def test_body_kinds_on_the_wire() -> None:
    assert Message(body="hi").encode() == bytes.fromhex("005377a1026869")
    assert Message().encode() == bytes.fromhex("00537740")  # a body is mandatory: null value
    assert Message(body=b"ab", body_kind="data").encode() == bytes.fromhex("005375a0026162")
    assert Message(body=[[1]], body_kind="sequence").encode() == bytes.fromhex("005376c003015501")
    # One data section in a list decodes as plain bytes: the one-section form.
    assert Message.decode(Message(body=[b"x"], body_kind="data").encode()).body == b"x"


@pytest.mark.parametrize(
    ("kind", "body"),
    [("data", None), ("data", []), ("data", "text"), ("sequence", []), ("sequence", (1,)),
     ("nope", 1)],
)  # fmt: skip
def test_encode_rejects_bad_bodies(kind: Any, body: Any) -> None:
    with pytest.raises(ValueError):
        Message(body=body, body_kind=kind).encode()


def test_no_body_decodes_to_none() -> None:
    # Proton writes messages without any body section; accept them.
    msg = Message.decode(encode(HEADER) + encode(PROPS))
    assert msg.body is None and msg.body_kind == "value"
    assert msg.header == HEADER and msg.properties == PROPS
    assert Message.decode(b"") == Message()


H = encode(HEADER)
DA = encode(DeliveryAnnotations({}))
MA = encode(MessageAnnotations({}))
P = encode(PROPS)
AP = encode(ApplicationProperties({}))
D = encode(Data(b"d"))
SQ = encode(AmqpSequence([1]))
V = encode(AmqpValue(1))
F = encode(Footer({}))

BAD_ORDER = {
    "properties before header": P + H + V,
    "two headers": H + H + V,
    "message annotations before delivery annotations": MA + DA + V,
    "application properties before properties": AP + P + V,
    "body before properties": V + P,
    "two amqp-values": V + V,
    "data then amqp-value": D + V,
    "amqp-value then data": V + D,
    "data then sequence": D + SQ,
    "sequence then data": SQ + D,
    "data, sequence, data": D + SQ + D,
    "data around application properties": D + AP + D,
    "section after footer": V + F + V,
    "two footers": V + F + F,
    "header after footer": F + H,
}


@pytest.mark.parametrize("payload", list(BAD_ORDER.values()), ids=list(BAD_ORDER))
def test_bad_section_order(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        Message.decode(payload)
    with pytest.raises(DecodeError):
        bare_message_span(payload)


JUNK = {
    "not described": encode("just a string"),
    "not a section": encode(Open(container_id="c")),
    "unknown descriptor": encode(Described(ULong(0x1234), b"x")),
    "truncated": D[:-1],
    "truncated descriptor": b"\x00\x53",
    "trailing garbage": V + b"\xff",
    "data holding a string": bytes.fromhex("005375a10161"),
    "header that is not a list": bytes.fromhex("005370a10161"),
    "sized past the end": bytes.fromhex("005375b0000000ff00"),
}


@pytest.mark.parametrize("payload", list(JUNK.values()), ids=list(JUNK))
def test_junk(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        Message.decode(payload)


def test_repeated_body_sections_are_fine() -> None:
    assert Message.decode(H + D + D + D + F).body == [b"d", b"d", b"d"]
    assert Message.decode(SQ + SQ).body == [[1], [1]]


def _outcome(payload: bytes) -> tuple[str, Any]:
    try:
        return "ok", Message.decode(payload)
    except DecodeError as exc:
        return type(exc).__name__, str(exc)


# A request as pairlink sends it, and one with every section kind and every property set.
_SHAPES = [
    encode(HEADER) + P + encode(ApplicationProperties({"operation": "echo"}))
    + encode(Data(bytes(range(64)))),
    Message(body=[b"a", b"b"], body_kind="data", **ANNOTATED).encode(),
    Message(body={"k": [1, 2.5]}, **ANNOTATED).encode(),
    Message(body=[[1], ["x"]], body_kind="sequence", properties=PROPS).encode(),
]  # fmt: skip


def _variants(payload: bytes) -> list[bytes]:
    """Every truncation and many one-byte corruptions of ``payload``."""
    out = [payload[:i] for i in range(len(payload) + 1)] + [payload + b"\x00", payload + V]
    for i, b in enumerate(payload):
        for new in {0x00, 0x40, 0x45, 0x53, 0x70, 0x75, 0x77, 0xA1, 0xC1, 0xFF, b ^ 1, b + 1 & 255}:
            out.append(payload[:i] + bytes([new]) + payload[i + 1 :])
    return out


@pytest.mark.parametrize("shape", range(len(_SHAPES)))
def test_section_fast_path_matches_general_path(shape: int, monkeypatch: Any) -> None:
    # Message.decode decodes ``0x00 0x53 code`` sections itself; without its table every
    # section goes through decode_from. Same bytes, same message or same error, either way.
    variants = _variants(_SHAPES[shape])
    fast = [_outcome(v) for v in variants]
    monkeypatch.setattr(messaging, "_SECTION_DEC", {})
    general = [_outcome(v) for v in variants]
    assert fast == general
    assert sum(kind == "ok" for kind, _ in fast) > len(_SHAPES[shape]) // 4  # not all junk


@pytest.mark.parametrize("levels", [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_section_fast_path_counts_nesting_like_the_general_path(
    levels: int, monkeypatch: Any
) -> None:
    nested: list[Any] = []
    for _ in range(levels):
        nested = [nested]
    payload = encode(AmqpValue(nested))
    fast = _outcome(payload)
    monkeypatch.setattr(messaging, "_SECTION_DEC", {})
    assert fast == _outcome(payload)
    assert (fast[0] == "ok") == (levels < MAX_DEPTH)


def test_long_and_symbolic_descriptors_decode_as_the_short_ones() -> None:
    # The general path: section descriptors written as a full ulong or as the symbolic name.
    long_form = b"".join(s[:1] + b"\x80" + bytes(7) + s[2:3] + s[3:] for s in (H, P, AP, D, F))
    name = Data.__amqp_descriptor__[1].encode()  # type: ignore[attr-defined]
    symbolic = b"\x00\xa3" + bytes([len(name)]) + name + D[3:]
    assert Message.decode(long_form) == Message.decode(H + P + AP + D + F)
    assert Message.decode(symbolic) == Message.decode(D)


# ------------------------------------------------------------------------ bare message span


@pytest.mark.parametrize(("kind", "body"), BODIES)
def test_bare_message_span(kind: Any, body: Any) -> None:
    annotated = Message(body=body, body_kind=kind, **ANNOTATED)
    bare = Message(body=body, body_kind=kind, properties=PROPS,
                   application_properties=ANNOTATED["application_properties"])  # fmt: skip
    payload = annotated.encode()
    start, end = bare_message_span(payload)
    assert payload[start:end] == bare.encode()
    # A gateway's rewrite: new annotations around the untouched bare bytes.
    forwarded = encode(Header(delivery_count=5)) + payload[start:end]
    assert Message.decode(forwarded).properties == PROPS


def test_bare_message_span_edges() -> None:
    assert bare_message_span(b"") == (0, 0)
    assert bare_message_span(H) == (len(H), len(H))
    assert bare_message_span(H + F) == (len(H), len(H))
    assert bare_message_span(H + DA + V) == (len(H + DA), len(H + DA + V))
    assert bare_message_span(AP + V + F) == (0, len(AP + V))
    big = encode(Data(b"x" * 100_000))
    assert bare_message_span(MA + big + F) == (len(MA), len(MA + big))


def test_bare_message_span_with_symbolic_and_long_descriptors() -> None:
    symbolic = encode(Described(S("amqp:data:binary"), b"payload"))
    ulong_form = b"\x00\x80" + (0x77).to_bytes(8, "big") + encode(7)
    payload = H + symbolic + symbolic + F
    assert bare_message_span(payload) == (len(H), len(H + symbolic * 2))
    assert Message.decode(payload).body == [b"payload", b"payload"]
    assert bare_message_span(ulong_form) == (0, len(ulong_form))
    assert Message.decode(ulong_form).body == 7
    with pytest.raises(DecodeError):
        bare_message_span(symbolic + ulong_form)


def test_bare_message_span_rejects_junk() -> None:
    for payload in (JUNK["not described"], JUNK["not a section"], JUNK["sized past the end"],
                    JUNK["truncated"], JUNK["unknown descriptor"]):  # fmt: skip
        with pytest.raises(DecodeError):
            bare_message_span(payload)


# ------------------------------------------------------------------------ Proton's Message


def _proton_full(body: Any, inferred: bool = False) -> proton.Message:
    return proton.Message(
        body=body, inferred=inferred, durable=True, priority=7, ttl=30.0, first_acquirer=True,
        delivery_count=2, instructions={S("x-opt-da"): 1}, annotations={S("x-opt-ma"): "m"},
        id=uuid.UUID(int=42), user_id=b"alice", address="svc/add", subject="add",
        reply_to="$me", correlation_id=ULong(9), content_type="application/msgpack",
        content_encoding="gzip", expiry_time=T0.timestamp(), creation_time=T0.timestamp(),
        group_id="g", group_sequence=3, reply_to_group_id="rg",
        properties={"operation": "add", "n": 2},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("proton_body", "inferred", "kind", "body"),
    [("text", False, "value", "text"),
     ({"a": [1, None]}, False, "value", {"a": [1, None]}),
     (b"raw", False, "value", b"raw"),
     (b"raw", True, "data", b"raw"),
     ([1, "x"], True, "sequence", [[1, "x"]]),
     ([1, "x"], False, "value", [1, "x"])],
)  # fmt: skip
def test_proton_encodes_we_decode(proton_body: Any, inferred: bool, kind: str, body: Any) -> None:
    payload = _proton_full(proton_body, inferred).encode()
    msg = Message.decode(payload)
    assert (msg.body_kind, msg.body) == (kind, body)
    assert msg.header == HEADER
    assert msg.delivery_annotations == {S("x-opt-da"): 1}
    assert msg.message_annotations == {S("x-opt-ma"): "m"}
    assert msg.properties == PROPS
    assert msg.application_properties == {"operation": "add", "n": 2}
    start, end = bare_message_span(payload)
    bare = Message(body=body, body_kind=kind, properties=PROPS,  # type: ignore[arg-type]
                   application_properties={"operation": "add", "n": 2})  # fmt: skip
    assert Message.decode(payload[start:end]) == bare


@pytest.mark.parametrize(
    ("kind", "body", "proton_body", "inferred"),
    [("value", "text", "text", False),
     ("value", {"a": [1, None]}, {"a": [1, None]}, False),
     ("data", b"raw", b"raw", True),
     ("sequence", [[1, "x"]], [1, "x"], True)],
)  # fmt: skip
def test_we_encode_proton_decodes(kind: Any, body: Any, proton_body: Any, inferred: bool) -> None:
    theirs = proton.Message()
    theirs.decode(Message(body=body, body_kind=kind, **ANNOTATED).encode())
    assert theirs.body == proton_body and theirs.inferred == inferred
    assert (theirs.durable, theirs.priority, theirs.ttl) == (True, 7, 30.0)
    assert (theirs.first_acquirer, theirs.delivery_count) == (True, 2)
    assert theirs.instructions == {S("x-opt-da"): 1}
    assert theirs.annotations == {S("x-opt-ma"): "m", ULong(3): True}
    assert theirs.id == uuid.UUID(int=42) and theirs.correlation_id == 9
    assert (theirs.user_id, theirs.address, theirs.subject) == (b"alice", "svc/add", "add")
    assert (theirs.reply_to, theirs.content_type, theirs.content_encoding) == (
        "$me", "application/msgpack", "gzip")  # fmt: skip
    assert theirs.expiry_time == theirs.creation_time == T0.timestamp()
    assert (theirs.group_id, theirs.group_sequence, theirs.reply_to_group_id) == ("g", 3, "rg")
    assert theirs.properties == {"operation": "add", "n": 2}


def _proton_sections(payload: bytes) -> list[Any]:
    sections = []
    while payload:
        data = proton.Data()
        n = data.decode(payload)
        sections.append(data.get_object())
        payload = payload[n:]
    return sections


def test_footer_against_proton_data() -> None:
    """Proton's Message has no footer; its Data codec still reads ours and writes one."""
    payload = Message(body="x", footer={S("x-opt-sig"): "sig"}).encode()
    value, footer = _proton_sections(payload)
    assert (value.descriptor, value.value) == (0x77, "x")
    assert (footer.descriptor, footer.value) == (0x78, {S("x-opt-sig"): "sig"})
    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(0x78), {proton.symbol("x-opt-h"): "v"}))
    msg = Message.decode(encode(AmqpValue("x")) + data.encode())
    assert msg.footer == {S("x-opt-h"): "v"}


# ------------------------------------------------------------------------------- hypothesis

_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=10),
              st.binary(max_size=10), st.floats(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=10,
)  # fmt: skip
_annotations = st.one_of(
    st.none(), st.dictionaries(st.from_regex(r"x-opt-[a-z]{1,5}", fullmatch=True).map(S), _values,
                               max_size=3))  # fmt: skip
_bodies = st.one_of(
    st.tuples(st.just("value"), _values),
    st.tuples(st.just("data"), st.one_of(st.binary(max_size=600),
                                         st.lists(st.binary(max_size=50), min_size=2, max_size=4))),
    st.tuples(st.just("sequence"), st.lists(st.lists(_values, max_size=3), min_size=1, max_size=3)),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(_bodies, _annotations, _annotations, _annotations,
       st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3)),
       st.booleans(), st.booleans())  # fmt: skip
def test_random_messages(body: Any, da: Any, ma: Any, footer: Any, app: Any, with_header: bool,
                         with_props: bool) -> None:  # fmt: skip
    msg = Message(body=body[1], body_kind=body[0], delivery_annotations=da,
                  message_annotations=ma, footer=footer, application_properties=app,
                  header=HEADER if with_header else None,
                  properties=PROPS if with_props else None)  # fmt: skip
    payload = msg.encode()
    assert Message.decode(payload) == msg
    start, end = bare_message_span(payload)
    bare = Message(body=body[1], body_kind=body[0], application_properties=app,
                   properties=PROPS if with_props else None)  # fmt: skip
    assert payload[start:end] == bare.encode()


@settings(max_examples=300, deadline=None)
@given(_bodies, _annotations, st.booleans(), st.data())
def test_mutated_messages_fail_to_decode_or_encode_again(
    body: Any, ma: Any, with_props: bool, data: st.DataObject
) -> None:
    """What the layer above does with a request: decode it, answer it. Whatever a peer's bytes
    decode into must encode again (the ids of a reply are copied from the request)."""
    msg = Message(body=body[1], body_kind=body[0], message_annotations=ma, header=HEADER,
                  properties=PROPS if with_props else None)  # fmt: skip
    payload = bytearray(msg.encode())
    for _ in range(data.draw(st.integers(1, 3))):  # constructor codes as often as any byte
        byte = st.integers(0, 255) | st.sampled_from([0x40, 0x43, 0x51, 0x52, 0x53, 0x55, 0xA1])
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(byte)
    try:
        got = Message.decode(bytes(payload))
    except DecodeError:
        return
    again = got.encode()
    assert Message.decode(again).encode() == again


def test_plain_int_message_id_goes_out_as_ulong() -> None:
    """``long`` is no legal message-id type, so a plain int must travel as ulong."""
    props = Properties(message_id=7, correlation_id=2**40)
    data = Message(body=None, properties=props).encode()
    assert data.startswith(bytes.fromhex("005373c0") + data[4:6] + bytes.fromhex("5307"))
    proton_msg = proton.Message()
    proton_msg.decode(data)  # Proton drops a message-id of a type the spec does not allow
    assert proton_msg.id == 7
    assert proton_msg.correlation_id == 2**40
    decoded = Message.decode(data).properties
    assert decoded is not None and decoded.message_id == 7


def test_decode_head_reads_the_sections_before_a_body_it_never_decodes() -> None:
    head = Message(properties=Properties(message_id=ULong(7), reply_to="$me"), body=None)
    payload = head.encode() + b"\x00\x53\x77\xff"  # an amqp-value of no AMQP type
    with pytest.raises(DecodeError):
        Message.decode(payload)
    decoded = decode_head(payload)
    assert decoded.properties is not None
    assert (decoded.properties.message_id, decoded.properties.reply_to) == (7, "$me")
    assert decoded.body is None


@pytest.mark.parametrize("junk", [b"\x00\x53", b"\x00\x53\x73\xff", b"\xff"])
def test_decode_head_of_a_junk_head_is_a_decode_error(junk: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_head(junk)
