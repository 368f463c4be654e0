"""Frames and protocol headers: layout, incremental reading, every framing error."""

from __future__ import annotations

import struct

import proton
import pytest

from pairlink._amqp.codec import encode
from pairlink._amqp.errors import FRAMING_ERROR, DecodeError, RemoteProtocolError
from pairlink._amqp.framing import (
    AMQP_HEADER,
    FRAME_AMQP,
    FRAME_SASL,
    HEARTBEAT,
    SASL_HEADER,
    TLS_HEADER,
    Frame,
    FrameReader,
    encode_frame,
    split_body,
)
from pairlink._amqp.messaging import Header
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    Begin,
    Close,
    Disposition,
    Open,
    SaslInit,
    SaslOutcome,
    Transfer,
)
from pairlink._amqp.types import Described, ULong

OPEN = Open(container_id="c")
BEGIN = Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)
TRANSFER = Transfer(handle=1, delivery_id=0, delivery_tag=b"t", message_format=0)


def frame_bytes(size: int, doff: int, ftype: int, channel: int, rest: bytes = b"") -> bytes:
    return struct.pack(">IBBH", size, doff, ftype, channel) + rest


def test_constants() -> None:
    assert AMQP_HEADER == b"AMQP\x00\x01\x00\x00"
    assert TLS_HEADER == b"AMQP\x02\x01\x00\x00"
    assert SASL_HEADER == b"AMQP\x03\x01\x00\x00"
    assert (FRAME_AMQP, FRAME_SASL) == (0, 1)
    assert HEARTBEAT == b"\x00\x00\x00\x08\x02\x00\x00\x00"


def test_encode_frame_layout() -> None:
    out = bytearray(b"prefix")
    encode_frame(out, 5, TRANSFER, b"payload")
    body = encode(TRANSFER) + b"payload"
    assert bytes(out) == b"prefix" + frame_bytes(8 + len(body), 2, 0, 5) + body
    sasl = bytearray()
    encode_frame(sasl, 0, SaslOutcome(code=0), frame_type=FRAME_SASL)
    assert sasl[4:8] == b"\x02\x01\x00\x00"
    empty = bytearray()
    encode_frame(empty, 0, None)
    assert bytes(empty) == HEARTBEAT
    view = bytearray()
    encode_frame(view, 2, TRANSFER, memoryview(b"xxpayloadxx")[2:-2])
    assert bytes(view) == frame_bytes(8 + len(body), 2, 0, 2) + body


def _stream() -> tuple[bytes, list[tuple[int, int, object, bytes]]]:
    out = bytearray(AMQP_HEADER)
    expected: list[tuple[int, int, object, bytes]] = []
    for channel, perf, payload in [
        (0, OPEN, b""),
        (3, BEGIN, b""),
        (3, TRANSFER, b"\x00\x53\x77\xa1\x02hi"),
        (3, TRANSFER, b"x" * 70_000),
        (0, None, b""),
        (7, Disposition(role=ROLE_RECEIVER, first=0), b""),
        (0, Close(), b""),
    ]:
        encode_frame(out, channel, perf, payload)
        expected.append((FRAME_AMQP, channel, perf, payload))
    return bytes(out), expected


def _drain(reader: FrameReader) -> list[Frame]:
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    return frames


def _as_tuples(frames: list[Frame]) -> list[tuple[int, int, object, bytes]]:
    return [(f.type, f.channel, f.performative, bytes(f.payload)) for f in frames]


@pytest.mark.parametrize("chunk", [1, 3, 7, 8, 100, 4096, 1 << 20])
def test_reader_any_chunking(chunk: int) -> None:
    data, expected = _stream()
    reader = FrameReader(1 << 20)
    header = None
    frames: list[Frame] = []
    for i in range(0, len(data), chunk):
        reader.feed(data[i : i + chunk])
        if header is None:
            header = reader.read_protocol_header()
            if header is None:
                continue
        frames += _drain(reader)
    assert header == AMQP_HEADER
    assert _as_tuples(frames) == expected
    assert reader.buffered == 0


def test_payload_views_stay_valid_while_reading_on() -> None:
    """Payload views must survive later feeds (the buffer is compacted and reused)."""
    reader = FrameReader()
    kept = []
    for i in range(300):
        out = bytearray()
        encode_frame(out, 1, TRANSFER, bytes([i % 256]) * 1000)
        reader.feed(out[:500])
        assert reader.read_frame() is None
        reader.feed(out[500:])
        frame = reader.read_frame()
        assert frame is not None
        kept.append(frame.payload)
    assert all(bytes(p) == bytes([i % 256]) * 1000 for i, p in enumerate(kept))


def test_many_small_frames_in_one_feed() -> None:
    out = bytearray()
    for i in range(20_000):
        encode_frame(out, i % 65536, None if i % 2 else TRANSFER, b"p" if i % 2 == 0 else b"")
    reader = FrameReader()
    reader.feed(out)
    frames = _drain(reader)
    assert len(frames) == 20_000
    assert frames[-1].performative is None and bytes(frames[-2].payload) == b"p"


def test_protocol_header_needs_eight_bytes() -> None:
    reader = FrameReader()
    for b in SASL_HEADER[:-1]:
        reader.feed(bytes([b]))
        assert reader.read_protocol_header() is None
    reader.feed(SASL_HEADER[-1:] + HEARTBEAT)
    assert reader.read_protocol_header() == SASL_HEADER
    frame = reader.read_frame()
    assert frame is not None and frame.performative is None


def test_heartbeat_and_extended_header() -> None:
    reader = FrameReader()
    body = encode(OPEN)
    ext = b"\xee" * 8  # doff 4: 8 bytes of extended header we must skip
    reader.feed(HEARTBEAT + frame_bytes(16 + len(body), 4, 0, 9, ext + body))
    reader.feed(frame_bytes(12, 3, 0, 0, b"\x00" * 4))  # extended header, empty body
    hb, op, hb2 = _drain(reader)
    assert (hb.type, hb.channel, hb.performative, bytes(hb.payload)) == (0, 0, None, b"")
    assert (op.channel, op.performative, bytes(op.payload)) == (9, OPEN, b"")
    assert hb2.performative is None


def test_sasl_frames() -> None:
    reader = FrameReader()
    out = bytearray()
    encode_frame(out, 0, SaslInit(mechanism="ANONYMOUS"), frame_type=FRAME_SASL)
    reader.feed(out)
    (frame,) = _drain(reader)
    assert frame.type == FRAME_SASL and frame.performative == SaslInit(mechanism="ANONYMOUS")


@pytest.mark.parametrize(
    "raw",
    [frame_bytes(7, 2, 0, 0), frame_bytes(0, 2, 0, 0), frame_bytes(8, 1, 0, 0),
     frame_bytes(8, 0, 0, 0), frame_bytes(8, 3, 0, 0), frame_bytes(600, 2, 0, 0),
     frame_bytes(8, 2, 2, 0), frame_bytes(8, 2, 0xFF, 0), AMQP_HEADER],
    ids=["size 7", "size 0", "doff 1", "doff 0", "doff past the end", "over max",
         "frame type 2", "frame type 255", "a header where a frame belongs"],
)  # fmt: skip
def test_framing_errors(raw: bytes) -> None:
    """Checked from the 8-byte header alone: no waiting for a body that may never come."""
    reader = FrameReader(max_frame_size=512)
    reader.feed(raw)
    with pytest.raises(RemoteProtocolError) as exc:
        reader.read_frame()
    assert exc.value.condition == FRAMING_ERROR
    assert not isinstance(exc.value, DecodeError)


def test_max_frame_size_can_change() -> None:
    reader = FrameReader(max_frame_size=512)
    out = bytearray()
    encode_frame(out, 0, TRANSFER, b"x" * 1000)
    reader.feed(out)
    with pytest.raises(RemoteProtocolError):
        reader.read_frame()
    reader.max_frame_size = 4096
    frame = reader.read_frame()
    assert frame is not None and len(frame.payload) == 1000


def _body_frame(body: bytes, ftype: int = FRAME_AMQP) -> bytes:
    return frame_bytes(8 + len(body), 2, ftype, 0, body)


@pytest.mark.parametrize(
    ("raw"),
    [_body_frame(encode(1)), _body_frame(encode([1, 2])), _body_frame(b"\xff"),
     _body_frame(encode(Header())), _body_frame(encode(Described(ULong(0x99), None))),
     _body_frame(encode(OPEN)[:-1]), _body_frame(encode(SaslInit(mechanism="X"))),
     _body_frame(encode(OPEN), FRAME_SASL), _body_frame(b"\x00\x53")],
    ids=["int", "list", "bad constructor", "a message section", "unknown descriptor",
         "truncated performative", "SASL body in an AMQP frame", "AMQP body in a SASL frame",
         "descriptor only"],
)  # fmt: skip
def test_bodies_that_are_not_performatives(raw: bytes) -> None:
    reader = FrameReader()
    reader.feed(raw)
    with pytest.raises(DecodeError):
        reader.read_frame()


def test_split_body_does_not_copy() -> None:
    body = encode(TRANSFER) + b"message"
    perf, payload = split_body(body)
    assert perf == TRANSFER and bytes(payload) == b"message"
    assert payload.obj is body
    view = memoryview(bytearray(body))
    perf, payload = split_body(view)
    assert payload.obj is view.obj
    with pytest.raises(DecodeError):
        split_body(b"\x00")


def test_reads_what_proton_writes() -> None:
    conn = proton.Connection()
    conn.container = "proton"
    transport = proton.Transport()
    transport.bind(conn)
    conn.open()
    ssn = conn.session()
    ssn.open()
    snd = ssn.sender("l")
    snd.open()
    data = transport.peek(transport.pending()) or b""
    reader = FrameReader()
    perfs: list[object] = []
    for b in data:  # one byte at a time
        reader.feed(bytes([b]))
        if not perfs:
            if (header := reader.read_protocol_header()) is not None:
                perfs.append(header)
            continue
        if (frame := reader.read_frame()) is not None:
            perfs.append(frame.performative)
    assert perfs[0] == AMQP_HEADER
    assert [type(p).__name__ for p in perfs[1:]] == ["Open", "Begin", "Attach"]
