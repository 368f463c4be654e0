"""The codec's fast paths give exactly what the general paths give, for any bytes.

A composite's decoder reads the common encodings of its fields inline (described.py's
``_INLINE``): compared here, on random field encodings, truncations and wrong counts, with the
decoder the same generator makes without them. A message's application-properties and
message-annotations are decoded once per distinct encoding (codec.py's ``memoized_maps``):
compared with a fresh decode, for our bytes and Proton's.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairlink._amqp import described
from pairlink._amqp.codec import ClassDecoder
from pairlink._amqp.described import class_decoder
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.messaging import Message, Properties
from pairlink._amqp.performatives import SPEC_CLASSES
from pairlink._amqp.types import Symbol, UInt, ULong

COMPOSITES = [c for c in SPEC_CLASSES if hasattr(c, "__amqp_fields__")]


def _plain_decoder(cls: type) -> ClassDecoder:
    """``cls``'s decoder as generated without the inline reads: the general path."""
    made: list[ClassDecoder] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(described, "_INLINE", {})
        patch.setattr(described, "_register", lambda _c, _e, dec, _p, _w: made.append(dec))
        name = cls.__amqp_descriptor__[1]  # type: ignore[attr-defined]
        specs = list(cls.__amqp_fields__)  # type: ignore[attr-defined]
        described._gen_composite(cls, str(name), b"", specs, cls.__amqp_provides__)  # type: ignore[attr-defined]
    return made[0]


PLAIN = {cls: _plain_decoder(cls) for cls in COMPOSITES}

# Field encodings: every one an inline read takes, their wide twins, values of other types,
# malformed ones (bad UTF-8 and ASCII, a boolean byte of 2) and described values.
FIELDS = [
    b"\x40", b"\xa1\x03abc", b"\xb1\x00\x00\x00\x03abc", b"\xa1\x00", b"\xa3\x03xyz",
    b"\xb3\x00\x00\x00\x01q", b"\xa0\x02\x00\x01", b"\xb0\x00\x00\x00\x01\xff", b"\x52\x07",
    b"\x70\x00\x01\x00\x00", b"\x43", b"\x53\x09", b"\x80" + bytes(7) + b"\x05", b"\x44",
    b"\x41", b"\x42", b"\x56\x01", b"\x56\x02", b"\x83" + struct.pack(">q", 1_700_000_000_000),
    b"\x98" + bytes(range(16)), b"\xa1\x02\xff\xfe", b"\xa3\x01\xff", b"\x71\x00\x00\x00\x05",
    b"\x54\xff", b"\x50\x03", b"\x45", b"\xc1\x01\x00", b"\xc1\x05\x02\xa3\x01ka\x40",
    b"\xe0\x05\x02\xa3\x01\x61\x62", b"\x00\x53\x24\x45", b"\x00\x53\x1d\xc0\x03\x01\xa3\x00",
]  # fmt: skip


def _outcome(dec: ClassDecoder, buf: bytes) -> tuple[Any, ...]:
    try:
        value, end = dec(buf[0], buf, 1, 0)
    except Exception as exc:  # the two must fail alike, whatever the failure
        return ("error", type(exc), str(exc))
    fields = [(type(v), v) for v in attrs.astuple(value, recurse=False)]
    return ("ok", type(value), fields, end)


@st.composite
def composite_bytes(draw: st.DrawFn) -> tuple[type, bytes]:
    cls = draw(st.sampled_from(COMPOSITES))
    width = len(cls.__amqp_fields__)
    fields = draw(st.lists(st.sampled_from(FIELDS), max_size=width + 2))
    body = b"".join(fields)
    count = len(fields) + draw(st.sampled_from([0, 0, 0, 1]))
    form = draw(st.sampled_from(["list8", "list32", "list0"]))
    if form == "list8" and len(body) < 255:
        buf = bytes((0xC0, len(body) + 1, count)) + body
    elif form == "list32" or form == "list8":
        buf = struct.pack(">BII", 0xD0, len(body) + 4, count) + body
    else:
        buf = b"\x45"
    cut = draw(st.integers(0, len(buf)))
    return cls, buf if draw(st.booleans()) else buf[:cut] or buf


@settings(max_examples=3000, deadline=None)
@given(composite_bytes())
def test_inline_field_reads_decode_as_the_tables_do(case: tuple[type, bytes]) -> None:
    """Same value of the same types, or the same exception with the same words."""
    cls, buf = case
    assert _outcome(class_decoder(cls), buf) == _outcome(PLAIN[cls], buf)


def test_inline_reads_are_generated_for_the_common_fields() -> None:
    """The comparison above is not vacuous: a message-id is read inline when it is a string
    or binary, never when it is a ulong (whose general decoder wraps it)."""
    lines = "\n".join(described._reader(0, Properties.__amqp_fields__[0][1]))  # type: ignore[attr-defined]
    assert "str(buf[off + 2:e], 'utf-8')" in lines and "bytes(buf[off + 2:e])" in lines
    assert "c == 83" not in lines  # 0x53, a smallulong


# ------------------------------------------------------------------ remembered map sections


def _app_message(app: dict[str, Any]) -> bytes:
    return Message(body=b"x", body_kind="data", application_properties=app).encode()


def test_a_repeated_map_section_decodes_to_an_equal_map_of_its_own() -> None:
    payload = _app_message({"operation": "memo-a", "n": UInt(7), "s": Symbol("y")})
    first = Message.decode(payload).application_properties
    second = Message.decode(payload).application_properties
    assert first == second == {"operation": "memo-a", "n": 7, "s": "y"}
    assert first is not None and second is not None and first is not second
    assert [type(v) for v in second.values()] == [str, UInt, Symbol]
    first["operation"] = "changed"
    assert Message.decode(payload).application_properties == second


def test_a_map_holding_a_mutable_value_is_decoded_afresh() -> None:
    payload = _app_message({"operation": "memo-b", "list": [1, 2]})
    first = Message.decode(payload).application_properties
    assert first is not None
    first["list"].append(3)
    assert Message.decode(payload).application_properties == {"operation": "memo-b", "list": [1, 2]}


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_a_remembered_map_counts_against_the_budget_as_a_decoded_one(
    wrap: Callable[[bytes], Any],
) -> None:
    """A map of one key and value fits a budget of 2, not of 1, hit or miss."""
    payload = _app_message({"operation": "memo-c"})
    for _ in range(2):
        assert Message.decode(wrap(payload), max_elements=2).application_properties == {
            "operation": "memo-c"
        }
        with pytest.raises(DecodeError, match="more than 1 values"):
            Message.decode(wrap(payload), max_elements=1)


def test_malformed_map_sections_fail_alike_every_time() -> None:
    good = _app_message({"operation": "memo-d"})
    start = good.index(b"\x00\x53\x74")
    for bad in (good[: start + 8], good.replace(b"memo-d", b"memo\xff\xfe"),
                good[: start + 4] + bytes((good[start + 4], 3)) + good[start + 6 :]):  # fmt: skip
        errors = set()
        for _ in range(2):
            with pytest.raises(DecodeError) as caught:
                Message.decode(bad)
            errors.add(str(caught.value))
        assert len(errors) == 1


def test_the_memo_forgets_when_full() -> None:
    """More distinct sections than it holds: each still decodes to its own map."""
    payloads = {i: _app_message({"operation": f"many-{i}"}) for i in range(600)}
    for _ in range(2):
        for i, payload in payloads.items():
            assert Message.decode(payload).application_properties == {"operation": f"many-{i}"}


PROPERTY_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=300),
    st.binary(max_size=20), st.floats(allow_nan=False), st.uuids(),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=20), PROPERTY_VALUES, max_size=5),
    st.dictionaries(st.text("xyz-", min_size=1, max_size=8), PROPERTY_VALUES, max_size=3),
    st.one_of(st.none(), st.text(max_size=300), st.integers(0, 2**64 - 1), st.uuids()),
)
def test_proton_messages_decode_alike_first_and_again(
    app: dict[str, Any], annotations: dict[str, Any], message_id: Any
) -> None:
    """Proton's bytes (every section it writes) decode to what Proton itself reads from them,
    the first time and from the memo."""
    theirs = proton.Message(
        body={"k": [1, "v"]}, id=ULong(message_id) if isinstance(message_id, int) else message_id,
        correlation_id=message_id if isinstance(message_id, str) else None, reply_to="$me",
        address="svc", subject="op", content_type="application/json", ttl=2.5, durable=True,
        properties=app, annotations={Symbol(k): v for k, v in annotations.items()},
        instructions={Symbol("x-opt-i"): 1}, creation_time=1_700_000_000.5, group_sequence=4,
    )  # fmt: skip
    payload = theirs.encode()
    back = proton.Message()
    back.decode(payload)
    first, second = Message.decode(payload), Message.decode(payload)
    assert first == second
    assert (first.application_properties or {}) == (back.properties or {})
    assert (first.message_annotations or {}) == (back.annotations or {})
    assert first.body == back.body and first.header is not None and first.header.ttl == 2500
    props = first.properties
    assert props is not None
    assert (props.message_id, props.correlation_id) == (back.id, back.correlation_id)
    assert (props.reply_to, props.to, props.subject) == ("$me", "svc", "op")
    assert props.content_type == "application/json" and props.group_sequence == 4
    if isinstance(message_id, uuid.UUID):
        assert type(props.message_id) is uuid.UUID
