"""The transfer fast path (transfer_codec.py) against the generic codec it stands in for.

Whatever a frame holds, ``FrameReader`` must answer exactly what the generic decoder answers:
the same ``Transfer`` and payload, or the same error. The reference is the same reader with
the fast decoder switched off. Outgoing, ``encode_frame`` must write the very bytes the
generic class encoder writes.
"""

from __future__ import annotations

import struct
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairlink._amqp import framing
from pairlink._amqp.codec import encode_into
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.framing import FrameReader, encode_frame
from pairlink._amqp.messaging import Accepted
from pairlink._amqp.performatives import RCV_SECOND, Flow, Transfer
from pairlink._amqp.transfer_codec import decode_transfer

PAYLOAD = b"\x00\x53\x75\xa0\x03abc"  # a data section: the payload is opaque to the frame


def frame(body: bytes, channel: int = 3, ftype: int = 0) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, ftype, channel) + body


def generic_only() -> Any:
    """The reader as it was before the fast path: every body through the generic codec."""
    return mock.patch.object(framing, "decode_transfer", return_value=None)


def read(data: bytes, max_elements: int = 1 << 17) -> tuple[str, Any, Any, bytes]:
    """What a reader makes of one frame (followed by junk, which must not matter)."""
    reader = FrameReader(max_elements=max_elements)
    reader.feed(data + b"\x00\x53\x14\xc0\xff\x0b" + b"\x41" * 20)
    try:
        got = reader.read_frame()
    except Exception as exc:  # compared by type and words
        return ("error", type(exc), str(exc), b"")
    assert got is not None
    return ("frame", got.channel, got.performative, bytes(got.payload))


def same_as_generic(data: bytes, max_elements: int = 1 << 17) -> tuple[str, Any, Any, bytes]:
    fast = read(data, max_elements)
    with generic_only():
        generic = read(data, max_elements)
    assert fast == generic
    return fast


def is_fast(body: bytes) -> bool:
    """Whether the fast decoder takes this body (after the 3-byte descriptor) itself."""
    return decode_transfer(body, 3, len(body)) is not None


# -- bodies built field by field ---------------------------------------------------------------


def uint_forms(v: int) -> list[bytes]:
    forms = [b"\x70" + struct.pack(">I", v)]
    if v <= 255:
        forms.append(bytes((0x52, v)))
    if v == 0:
        forms.append(b"\x43")
    return forms


def body_of(fields: list[bytes], list32: bool = False, descriptor: bytes = b"\x53\x14") -> bytes:
    content = b"".join(fields)
    if list32:
        head = b"\xd0" + struct.pack(">II", len(content) + 4, len(fields))
    else:
        head = bytes((0xC0, len(content) + 1, len(fields)))
    return b"\x00" + descriptor + head + content


FULL = [b"\x52\x07", b"\x70\x00\x01\x00\x00", b"\xa0\x02\x00\x01", b"\x43", b"\x42", b"\x42"]


@pytest.mark.parametrize("list32", [False, True])
@pytest.mark.parametrize("count", range(1, 7))
def test_trailing_fields_omitted(list32: bool, count: int) -> None:
    body = body_of(FULL[:count], list32)
    kind, channel, transfer, payload = same_as_generic(frame(body + PAYLOAD))
    assert (kind, channel, payload) == ("frame", 3, PAYLOAD)
    expected = Transfer(handle=7, delivery_id=65536, delivery_tag=b"\x00\x01", message_format=0,
                        settled=False, more=False)  # fmt: skip
    for name in ("delivery_id", "delivery_tag", "message_format", "settled")[max(0, count - 1) :]:
        setattr(expected, name, None)
    assert transfer == expected
    assert is_fast(body)


@pytest.mark.parametrize("handle", [0, 1, 255, 256, 2**32 - 1])
@pytest.mark.parametrize("delivery_id", [0, 200, 2**31 + 5])
def test_every_integer_form(handle: int, delivery_id: int) -> None:
    for h in uint_forms(handle):
        for d in uint_forms(delivery_id):
            for f in uint_forms(0) + uint_forms(0x1234):
                body = body_of([h, d, b"\xa0\x01t", f, b"\x41"])
                kind, _, transfer, _ = same_as_generic(frame(body))
                assert kind == "frame" and is_fast(body)
                assert (transfer.handle, transfer.delivery_id) == (handle, delivery_id)
                assert transfer.settled is True and transfer.message_format in (0, 0x1234)


def test_explicit_nulls_and_booleans() -> None:
    for settled, want in ((b"\x40", None), (b"\x41", True), (b"\x42", False)):
        for more, more_want in ((b"\x40", False), (b"\x41", True), (b"\x42", False)):
            body = body_of([b"\x43", b"\x40", b"\x40", b"\x40", settled, more])
            _, _, transfer, _ = same_as_generic(frame(body + PAYLOAD))
            assert is_fast(body)
            assert transfer == Transfer(handle=0, settled=want, more=more_want)


def test_all_eleven_fields() -> None:
    """Peers that write every field (nulls and false flags) stay on the fast path."""
    tail = [b"\x40", b"\x40", b"\x42", b"\x41", b"\x40"]
    body = body_of(FULL + tail)
    _, _, transfer, payload = same_as_generic(frame(body + PAYLOAD))
    assert is_fast(body) and payload == PAYLOAD
    assert (transfer.resume, transfer.aborted, transfer.batchable) == (False, True, False)


@pytest.mark.parametrize(
    "body",
    [
        body_of(FULL, descriptor=b"\xa3\x12amqp:transfer:list"),  # symbolic descriptor
        body_of(FULL, descriptor=b"\x80" + struct.pack(">Q", 0x14)),  # ulong descriptor
        body_of([*FULL[:2], b"\xb0\x00\x00\x00\x02ab"]),  # vbin32 tag
        body_of([*FULL[:4], b"V\x01"]),  # the one-byte boolean form
        body_of([*FULL, b"P\x01"]),  # rcv-settle-mode second
        body_of([*FULL, b"@", b"\x00S$E"]),  # a state: accepted
        body_of(FULL + [b"\x40"] * 5 + [b"\x40"]),  # a twelfth field from a newer peer
    ],
)
def test_unusual_shapes_fall_back(body: bytes) -> None:
    kind, _, transfer, payload = same_as_generic(frame(body + PAYLOAD))
    assert kind == "frame" and payload == PAYLOAD and transfer.handle == 7
    assert transfer.delivery_tag == (b"ab" if b"\xb0" in body else b"\x00\x01")
    assert not (body.startswith(b"\x00\x53\x14") and is_fast(body))


@pytest.mark.parametrize(
    "body",
    [
        b"\x00\x53\x14\x45",  # list0: handle is mandatory
        body_of([b"\x40"]),  # null handle
        body_of([b"\x53\x01"]),  # a ulong is not a handle
        body_of([*FULL[:4], b"V\x02"]),  # boolean byte 2
        body_of([*FULL[:3], b"\xa1\x01x"]),  # a string is not a message-format
        b"\x00\x53\x14\xc0\x05\x02\x52\x01\x43",  # size too large for the content
        b"\x00\x53\x14\xc0\x02\x02\x52\x01\x43",  # size too small
        b"\x00\x53\x14\xc0\x04\x03\x52\x01\x43",  # count beyond the content
        b"\x00\x53\x14\xc0\x04\x01\x52\x01\x43",  # count short of the content
        b"\x00\x53\x14\xc0\x04\x02\x52\x01\xa0\x09",  # tag runs past the list
        b"\x00\x53\x14\xd0\x00\x00\x00\x09\x00\x00\x00\x02\x52\x01\x43",  # list32 too large
        b"\x00\x53\x14\xc0\x02\x01\x70\x00",  # uint cut short
        b"\x00\x53\x14",  # no list at all
        b"\x00\x53\x14\xc0",  # list header cut short
    ],
)
def test_malformed_transfers_keep_their_errors(body: bytes) -> None:
    kind, error_type, _, _ = same_as_generic(frame(body))
    assert kind == "error" and error_type.__name__ == "DecodeError"


def test_sasl_frame_and_tiny_budget_take_the_generic_path() -> None:
    body = body_of(FULL)
    assert same_as_generic(frame(body, ftype=1))[0] == "error"  # not a SASL performative
    assert same_as_generic(frame(body), max_elements=10)[0] == "error"  # over the budget
    assert same_as_generic(frame(body), max_elements=11)[0] == "frame"


# -- property-based: random field encodings, valid or not --------------------------------------

uints = st.sampled_from([0, 1, 7, 255, 256, 65535, 2**32 - 1])
uint_field = st.one_of(
    uints.flatmap(lambda v: st.sampled_from(uint_forms(v))),
    st.sampled_from([b"\x40", b"\x53\x01", b"\x44", b"\x80" + bytes(8), b"\x50\x01"]),
)
bool_field = st.sampled_from([b"\x40", b"\x41", b"\x42", b"\x56\x00", b"\x56\x01", b"\x56\x07"])
tag_field = st.one_of(
    st.binary(max_size=40).map(lambda b: bytes((0xA0, len(b))) + b),
    st.binary(max_size=3).map(lambda b: b"\xb0" + struct.pack(">I", len(b)) + b),
    st.sampled_from([b"\x40", b"\xa1\x01x", b"\xa0"]),
)
tail_field = st.sampled_from([b"\x40", b"\x41", b"\x42", b"\x50\x00", b"\x00\x53\x24\x45"])


@settings(max_examples=600, deadline=None)
@given(
    st.tuples(uint_field, uint_field, tag_field, uint_field, bool_field, bool_field),
    st.lists(tail_field, max_size=6),
    st.integers(0, 6),
    st.booleans(),
    st.sampled_from([0, 0, 0, 1, -1, 2, -2]),
    st.sampled_from([0, 0, 0, 1, -1]),
    st.binary(max_size=8),
)
def test_any_encoding_reads_as_the_generic_codec_reads_it(
    head: tuple[bytes, ...],
    tail: list[bytes],
    keep: int,
    list32: bool,
    size_skew: int,
    count_skew: int,
    payload: bytes,
) -> None:
    fields = [*head[: keep + 1], *(tail if keep == 5 else [])]
    body = bytearray(body_of(fields, list32))
    if list32:
        size, count = struct.unpack_from(">II", body, 4)
        struct.pack_into(">II", body, 4, max(0, size + size_skew), max(0, count + count_skew))
    else:
        body[4] = max(0, min(255, body[4] + size_skew))
        body[5] = max(0, min(255, body[5] + count_skew))
    same_as_generic(frame(bytes(body) + payload))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(0, 40), st.integers(0, 255))
def test_corrupted_frames_read_as_the_generic_codec_reads_them(
    payload: bytes, at: int, byte: int
) -> None:
    data = bytearray(frame(body_of(FULL) + payload))
    data[8 + at % (len(data) - 8)] = byte  # anywhere in the body
    same_as_generic(bytes(data))


# -- encoding ---------------------------------------------------------------------------------


def generic_frame(channel: int, transfer: Transfer, payload: bytes) -> bytes:
    out = bytearray(8)
    encode_into(transfer, out)
    out += payload
    struct.pack_into(">IBBH", out, 0, len(out), 2, 0, channel)
    return bytes(out)


optional_uint = st.none() | st.sampled_from([0, 1, 255, 256, 70000, 2**32 - 1])
transfers = st.builds(
    Transfer,
    handle=st.sampled_from([0, 1, 255, 256, 2**32 - 1]),
    delivery_id=optional_uint,
    delivery_tag=st.none() | st.binary(max_size=33),
    message_format=optional_uint,
    settled=st.none() | st.booleans(),
    more=st.booleans(),
    rcv_settle_mode=st.sampled_from([None, None, None, RCV_SECOND]),
    state=st.sampled_from([None, None, None, Accepted()]),
    resume=st.sampled_from([False, False, True]),
    aborted=st.sampled_from([False, False, True]),
    batchable=st.sampled_from([False, False, True]),
)


@settings(max_examples=500, deadline=None)
@given(transfers, st.integers(0, 65535), st.binary(max_size=300))
def test_encoded_frames_are_the_generic_bytes(
    transfer: Transfer, channel: int, payload: bytes
) -> None:
    out = bytearray(b"before")
    encode_frame(out, channel, transfer, payload)
    assert bytes(out) == b"before" + generic_frame(channel, transfer, payload)
    kind, got_channel, got, got_payload = same_as_generic(bytes(out[6:]))
    assert (kind, got_channel, got, got_payload) == ("frame", channel, transfer, payload)


def test_out_of_range_fields_fail_as_the_generic_encoder_fails() -> None:
    for bad in (Transfer(handle=2**32), Transfer(handle=0, delivery_id=-1)):
        with pytest.raises(ValueError, match="as AMQP uint") as fast:
            encode_frame(bytearray(), 0, bad)
        with pytest.raises(ValueError) as generic:
            encode_into(bad, bytearray())
        assert str(fast.value) == str(generic.value)
    with pytest.raises(LocalProtocolError, match="handle is missing"):
        encode_frame(bytearray(), 0, Transfer(handle=None))  # type: ignore[arg-type]


def test_other_performatives_keep_the_generic_encoder() -> None:
    flow = Flow(incoming_window=5, next_outgoing_id=1, outgoing_window=5)
    out = bytearray()
    encode_frame(out, 2, flow)
    assert same_as_generic(bytes(out))[1:] == (2, flow, b"")


def test_a_payload_view_of_wider_items_counts_its_bytes() -> None:
    transfer = Transfer(handle=0, delivery_id=1, delivery_tag=b"t", message_format=0, settled=True)
    words = memoryview(bytearray(b"abcdefgh")).cast("I")  # 2 items, 8 bytes
    out = bytearray()
    encode_frame(out, 0, transfer, words)
    assert bytes(out) == generic_frame(0, transfer, b"abcdefgh")
