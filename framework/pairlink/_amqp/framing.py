"""Protocol headers and frames: bytes in -> ``Frame`` objects, frames -> bytes out.

A frame is an 8-byte header (size: uint32 of the whole frame, doff: header length in 4-byte
words, type, channel: uint16), any extended header up to ``doff * 4``, then the body: one
described performative followed by an opaque payload (only ``transfer`` uses it). A frame with an
empty body is a heartbeat.

``FrameReader`` keeps received bytes in one ``bytearray`` with a read offset and drops the
consumed prefix only when it dominates the buffer, so a stream of frames costs linear time
whatever sizes the socket hands us. Each frame's body is copied out once into its own buffer so
the payload ``memoryview`` stays valid after the read buffer moves on.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import attrs

from pairlink._amqp.codec import MAX_ELEMENTS, decode_from, encode_into
from pairlink._amqp.errors import FRAMING_ERROR, DecodeError, RemoteProtocolError
from pairlink._amqp.performatives import AMQP_PERFORMATIVES, SASL_PERFORMATIVES, Transfer
from pairlink._amqp.transfer_codec import (
    TRANSFER_PREFIX,
    TRANSFER_WEIGHT,
    decode_transfer,
    encode_transfer_frame,
    settled_whole,
)
from pairlink._amqp.types import Buffer, Decoded

__all__ = [
    "AMQP_HEADER",
    "FRAME_AMQP",
    "FRAME_SASL",
    "HEARTBEAT",
    "SASL_HEADER",
    "TLS_HEADER",
    "Frame",
    "FrameReader",
    "encode_frame",
    "split_body",
]

#: Protocol headers: "AMQP", protocol id, major, minor, revision (AMQP 0, TLS 2, SASL 3).
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

FRAME_AMQP = 0
FRAME_SASL = 1

_HEADER = struct.Struct(">IBBH")
#: The empty AMQP frame on channel 0: keeps an idle connection alive.
HEARTBEAT = _HEADER.pack(8, 2, FRAME_AMQP, 0)

_ALLOWED = {FRAME_AMQP: AMQP_PERFORMATIVES, FRAME_SASL: SASL_PERFORMATIVES}
_NO_PAYLOAD = memoryview(b"")
# Drop the consumed prefix once it is at least this large and more than half the buffer.
_COMPACT_AT = 1 << 16


@attrs.define(slots=True)
class Frame:
    """One received frame; ``performative`` is None for a heartbeat (empty body).

    ``performative`` is ``Decoded``: ``read_frame`` checked that it is a performative of the
    frame's type, but its readers dispatch on its class through tables mypy cannot follow."""

    type: int
    channel: int
    performative: Decoded
    payload: memoryview


def encode_frame(
    out: bytearray,
    channel: int,
    performative: object,
    payload: Buffer = b"",
    frame_type: int = FRAME_AMQP,
) -> None:
    """Append one frame (no extended header) to ``out``; ``performative=None`` writes an empty
    frame. Encodes straight into ``out`` and patches the size, so the body is never copied;
    a transfer takes the fast path of transfer_codec.py (same bytes)."""
    if type(performative) is Transfer and frame_type == FRAME_AMQP:
        encode_transfer_frame(out, channel, performative, payload)
        return
    start = len(out)
    out += HEARTBEAT  # placeholder header, patched below
    if performative is not None:
        encode_into(performative, out)
    if payload:
        out += payload
    size = len(out) - start
    if size > 0xFFFFFFFF:
        raise ValueError("frame larger than 4 GiB")
    _HEADER.pack_into(out, start, size, 2, frame_type, channel)


def split_body(body: Buffer, max_elements: int = MAX_ELEMENTS) -> tuple[Decoded, memoryview]:
    """Split a frame body into its performative and the payload after it, without copying the
    payload (a zero-copy view of ``body``). Raises ``DecodeError`` if the body does not start
    with a described value, or if that value holds more than ``max_elements`` values."""
    view = body if isinstance(body, memoryview) else memoryview(body)
    performative, offset = decode_from(view, 0, max_elements)
    return performative, view[offset:]


class FrameReader:
    """Incremental parser for the byte stream of one connection.

    ``max_frame_size`` is the limit we announced in our ``open``; the engine may raise it
    after negotiation. Frame types other than AMQP and SASL are a framing error.
    ``max_elements`` bounds the values one performative may decode into (``MAX_ELEMENTS``).
    """

    __slots__ = ("_buf", "_pos", "max_elements", "max_frame_size")

    def __init__(self, max_frame_size: int = 0xFFFFFFFF, max_elements: int = MAX_ELEMENTS) -> None:
        self.max_frame_size = max_frame_size
        self.max_elements = max_elements  # (below TRANSFER_WEIGHT: no fast path, see read_frame)
        self._buf = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a header or frame."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes."""
        pos = self._pos
        if pos:
            if pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
            elif pos >= _COMPACT_AT and pos * 2 >= len(self._buf):
                del self._buf[:pos]
                self._pos = 0
        self._buf += data

    def read_protocol_header(self) -> bytes | None:
        """The next 8 bytes (a protocol header) once they have all arrived; the caller checks
        them, because which headers are acceptable depends on the connection's state."""
        pos = self._pos
        if len(self._buf) - pos < 8:
            return None
        self._pos = pos + 8
        return bytes(self._buf[pos : pos + 8])

    def pass_through(self, take: Callable[[int, int, int, bytearray], bool]) -> bool:
        """Offer the next frame to ``take`` if it is all here and a transfer of a whole
        pre-settled message in the usual shape (``settled_whole``): ``take(channel, handle,
        delivery_id, payload)``. True: it took the frame, which is read. False: the frame is
        still unread, for ``read_frame`` (which judges every other frame)."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            return False
        size, doff, ftype, channel = _HEADER.unpack_from(buf, pos)
        end = pos + size
        if (
            doff != 2
            or ftype != FRAME_AMQP
            or size > self.max_frame_size
            or end > len(buf)
            or self.max_elements < TRANSFER_WEIGHT
            or not buf.startswith(TRANSFER_PREFIX, pos + 8, end)
        ):
            return False
        found = settled_whole(buf, pos + 11, end)
        if found is None or not take(channel, found[0], found[1], buf[found[2] : end]):
            return False
        self._pos = end
        return True

    def read_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive.

        Raises ``RemoteProtocolError(FRAMING_ERROR)`` for an impossible header or one over
        ``max_frame_size`` (checked before the body arrives, so a hostile size cannot make us
        buffer it), and ``DecodeError`` for a body that is not a performative of its frame type.
        """
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            return None
        size, doff, ftype, channel = _HEADER.unpack_from(buf, pos)
        if size < 8:
            raise RemoteProtocolError(FRAMING_ERROR, f"frame size {size} is below 8")
        if doff < 2:
            raise RemoteProtocolError(FRAMING_ERROR, f"data offset {doff} is below 2")
        if size > self.max_frame_size:
            raise RemoteProtocolError(
                FRAMING_ERROR, f"frame size {size} exceeds max-frame-size {self.max_frame_size}"
            )
        body_at = doff * 4
        if body_at > size:
            raise RemoteProtocolError(
                FRAMING_ERROR, f"data offset {doff} points past the frame end ({size} bytes)"
            )
        allowed = _ALLOWED.get(ftype)
        if allowed is None:
            raise RemoteProtocolError(FRAMING_ERROR, f"unknown frame type {ftype}")
        if len(buf) - pos < size:
            return None
        self._pos = pos + size
        if body_at == size:
            return Frame(ftype, channel, None, _NO_PAYLOAD)
        # The common transfer is read in place, its payload copied once; any other shape (and
        # every malformed one) goes the generic way below, which judges it.
        start = pos + body_at
        end = pos + size
        if (
            ftype == FRAME_AMQP
            and buf.startswith(TRANSFER_PREFIX, start, end)
            and self.max_elements >= TRANSFER_WEIGHT
        ):
            fast = decode_transfer(buf, start + 3, end)
            if fast is not None:
                return Frame(ftype, channel, fast[0], memoryview(buf[fast[1] : end]))
        # One copy into a private bytearray that is never resized, so views of it stay valid.
        body = buf[start:end]
        performative, payload = split_body(body, self.max_elements)
        if type(performative) not in allowed:
            kind = "AMQP" if ftype == FRAME_AMQP else "SASL"
            raise DecodeError(f"{kind} frame body is not a {kind} performative")
        return Frame(ftype, channel, performative, payload)
