"""The layouts of a call as pairlink writes it: written and read here, and nowhere else.

Our client writes every request one way (``wire.encode_request``): a header of a ttl alone;
properties of a message-id, a reply-to, the same id again as correlation-id, maybe a
content-type and an absolute-expiry-time (:func:`write_request_properties`); then
application-properties and the body. A service writes every reply's properties one way too: a
``to``, the request's id as correlation-id, maybe a content-type
(:func:`write_reply_properties`). Both sides read the other's in one pass
(:func:`read_usual_request`, :func:`read_reply_properties`): each reader checks every byte the
generic decoder would check and returns None for anything else, which the generic path then
decodes, or refuses, as ever. The struct formats are named by the AMQP type they hold: an id is
a ``ulong`` (unsigned), an expiry a ``timestamp`` (signed milliseconds).

It builds no section objects (and imports none: ``messaging`` builds its ``Message`` from what
:func:`read_usual_request` returns, and a service its request without a message at all).
"""

from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

from pairlink._amqp.codec import DECODE_FAULTS, DECODERS
from pairlink._amqp.described import encode_message_id
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.scalars import encode_string
from pairlink._amqp.types import Symbol

USUAL_HEADER = b"\x00\x53\x70\xc0\x08\x03\x40\x40\x70"
"""The header of a uint ttl alone (durable and priority null, the rest left out), as the
generic encoder writes a ttl of 256 ms or more: 13 bytes with the ttl."""
PROPERTIES_HEAD = b"\x00\x53\x73\xc0\x00\x00"
"""The properties section as its generated encoder begins it: the descriptor, then a list8
whose size and count :func:`finish_properties` patches in."""
_PROPERTIES_LIST8 = PROPERTIES_HEAD[:4]
_NULL = 0x40
_TIMESTAMP = 0x83
_UINT = struct.Struct(">I")
_ULONG = struct.Struct(">Q")
_ULONG_ID = struct.Struct(">BQ")  # a ulong id in its full form (0x80), as a counter's past 255
_TIMESTAMP_MS = struct.Struct(">q")
_NULL_THEN_TIMESTAMP = struct.Struct(">BBq")  # content-encoding null, absolute-expiry-time
_LIST32_HEAD = struct.Struct(">BII")
_ID_DECODERS = {c: DECODERS[c] for c in (0x44, 0x53, 0x80)}  # ulong ids, wrapped as ever
_ID_SIZES = {0x44: 1, 0x53: 2, 0x80: 9}
_FAULTS = (DecodeError, *DECODE_FAULTS)
_SYMBOLS: dict[bytes, Symbol] = {}  # content-types by their encoding: a handful, repeated
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)
FIRST_MS = (datetime.datetime.min.replace(tzinfo=datetime.UTC) - _EPOCH) // _ONE_MS
LAST_MS = (datetime.datetime.max.replace(tzinfo=datetime.UTC) - _EPOCH) // _ONE_MS
"""The timestamps (ms since the epoch) a ``datetime`` holds: the decoder refuses any other."""


# ---------------------------------------------------------------------------- writing


def finish_properties(out: bytearray, start: int, count: int) -> None:
    """Patch the size and count of the properties list begun at ``start`` (with
    :data:`PROPERTIES_HEAD`), widened to a list32 when it does not fit a list8, as the codec
    does."""
    size = len(out) - start - 5
    if size <= 0xFF:
        out[start + 4] = size
        out[start + 5] = count
    else:
        out[start + 3 : start + 6] = _LIST32_HEAD.pack(0xD0, size + 3, count)


def address_fields(reply_to: str | None) -> bytes:
    """A request's user-id, to and subject (null) and reply-to."""
    out = bytearray(b"\x40\x40\x40")
    if reply_to is None:
        out.append(_NULL)
    else:
        encode_string(reply_to, out)
    return bytes(out)


def write_request_properties(
    out: bytearray,
    message_id: object,
    address: bytes,
    content_type: bytes,
    expiry_ms: int | None,
) -> None:
    """Append a request's properties: ``message_id`` (not None) as message-id and
    correlation-id around ``address`` (:func:`address_fields`), then ``content_type`` (the
    encoded symbol, or ``b""`` for none) and the absolute-expiry-time, when there is one."""
    start = len(out)
    out += PROPERTIES_HEAD
    encode_message_id(message_id, out)
    mid = out[start + len(PROPERTIES_HEAD) :]
    out += address
    out += mid
    if expiry_ms is not None:  # content-type (or null), content-encoding, the expiry
        out += content_type or b"\x40"
        out += _NULL_THEN_TIMESTAMP.pack(_NULL, _TIMESTAMP, expiry_ms)
        finish_properties(out, start, 9)
    elif content_type:
        out += content_type
        finish_properties(out, start, 7)
    else:
        finish_properties(out, start, 6)


def usual_request_parts(header: bytes, address: bytes, content_type: bytes) -> tuple[bytes, ...]:
    """What :func:`write_usual_request` writes around the ids and the expiry of a request with
    a ulong id of nine bytes and a deadline: the ``header`` and the properties' list head,
    their fields between the ids, and those from the second id to the expiry's value. Made
    once per (ttl, reply-to, content-type) by the caller, who keeps them."""
    content = (content_type or b"\x40") + bytes((_NULL, _TIMESTAMP))
    fields = _ULONG_ID.size + len(address) + _ULONG_ID.size + len(content) + _TIMESTAMP_MS.size
    out = bytearray(PROPERTIES_HEAD) + bytes(fields)
    finish_properties(out, 0, 9)
    return header + out[:-fields], address, content


def write_usual_request(parts: tuple[bytes, ...], message_id: int, expiry_ms: int) -> bytearray:
    """The header and properties of the usual request (:func:`usual_request_parts`): the
    same bytes :func:`write_request_properties` writes after the header for a ulong id over
    255, without encoding anything but the id, once, and the expiry."""
    head, address, content = parts
    ulong = _ULONG_ID.pack(0x80, message_id)
    out = bytearray(head)
    out += ulong
    out += address
    out += ulong
    out += content
    out += _TIMESTAMP_MS.pack(expiry_ms)
    return out


def write_reply_properties(
    out: bytearray, to: str | None, correlation_id: object, content_type: bytes
) -> None:
    """Append a reply's properties: ``to``, ``correlation_id`` (not None), then
    ``content_type`` (the encoded symbol, or ``b""`` for none)."""
    out += PROPERTIES_HEAD
    out += b"\x40\x40"  # message-id, user-id
    if to is None:
        out.append(_NULL)
    else:
        encode_string(to, out)
    out += b"\x40\x40"  # subject, reply-to
    encode_message_id(correlation_id, out)
    if content_type:
        out += content_type
        finish_properties(out, 0, 7)
    else:
        finish_properties(out, 0, 6)


# ---------------------------------------------------------------------------- reading


class UsualRequest(NamedTuple):
    """The fields of a request in the usual layout, and where its last two sections begin."""

    ttl: int
    message_id: str | int  # a str, or a ulong as the decoder wraps it (a ``ULong``)
    reply_to: str
    content_type: Symbol | None
    expiry_ms: int  # the absolute-expiry-time, within FIRST_MS..LAST_MS
    sections: int  # the offset of the application-properties section (its descriptor)


def read_usual_request(payload: bytes) -> UsualRequest | None:
    """The header and properties of ``payload`` if it is a request in the usual layout (a
    ttl of 256 ms or more, a ulong or string id, a string reply-to, a deadline), else None.
    The sections after them are the caller's to check and read."""
    try:
        if not payload.startswith(USUAL_HEADER) or not payload.startswith(_PROPERTIES_LIST8, 13):
            return None
        if payload[18] != 9:
            return None
        props_end = 18 + payload[17]
        code = payload[19]
        if code == 0xA1:  # the message-id: a string ...
            mid_end = 21 + payload[20]
            message_id: str | int = str(payload[21:mid_end], "utf-8")
        elif code in _ID_SIZES:  # ... or a ulong
            mid_end = 19 + _ID_SIZES[code]
            message_id = _ID_DECODERS[code](payload, 20, 1)[0]
        else:
            return None
        # user-id, to, subject: null; reply-to: a string; then the correlation-id, the same
        if not payload.startswith(b"\x40\x40\x40\xa1", mid_end):
            return None
        pos = mid_end + 5 + payload[mid_end + 4]
        reply_to = str(payload[mid_end + 5 : pos], "utf-8")
        end = pos + mid_end - 19
        if payload[pos:end] != payload[19:mid_end]:
            return None
        content_type = None
        if payload[end] == 0xA3:
            pos = end + 2 + payload[end + 1]
            key = payload[end:pos]
            content_type = _SYMBOLS.get(key)
            if content_type is None:
                content_type = Symbol(str(payload[end + 2 : pos], "ascii"))
                if len(_SYMBOLS) >= 64:
                    _SYMBOLS.clear()
                _SYMBOLS[key] = content_type
        elif payload[end] == _NULL:
            pos = end + 1
        else:
            return None
        if pos + 10 != props_end or not payload.startswith(b"\x40\x83", pos):
            return None  # content-encoding: null; the expiry: the last field
        expiry_ms = _TIMESTAMP_MS.unpack_from(payload, pos + 2)[0]
        if not FIRST_MS <= expiry_ms <= LAST_MS:
            return None
    except _FAULTS:
        return None
    return UsualRequest(
        _UINT.unpack_from(payload, 9)[0], message_id, reply_to, content_type, expiry_ms, pos + 10
    )


def read_reply_properties(
    payload: bytes, content_type: bytes
) -> tuple[str | int, str | None, int] | None:
    """``(correlation-id, to, end)`` of a reply whose properties are laid out as
    :func:`write_reply_properties` writes them with this ``content_type`` (encoded, not
    empty), ``end`` where the next section begins; None for any other layout. The id is what
    the generic path returns for it (a ulong as a plain ``int``)."""
    try:
        if not payload.startswith(_PROPERTIES_LIST8) or payload[5] != 7:
            return None
        end = 5 + payload[4]  # of the properties (7 fields: the content-type is the last)
        to: str | None = None
        if payload[8] == _NULL:
            pos = 9
        elif payload[8] == 0xA1:
            pos = 10 + payload[9]
            to = str(payload[10:pos], "utf-8")
        else:
            return None
        if not (payload.startswith(b"\x40\x40", 6) and payload.startswith(b"\x40\x40", pos)):
            return None  # message-id, user-id; subject, reply-to
        code = payload[pos + 2]
        correlation_id: str | int
        if code == 0x53:  # a ulong (small, full, zero) or a str8: what encode_message_id writes
            correlation_id = payload[pos + 3]
            pos += 4
        elif code == 0x80:
            correlation_id = _ULONG.unpack_from(payload, pos + 3)[0]
            pos += 11
        elif code == 0x44:
            correlation_id = 0
            pos += 3
        elif code == 0xA1:
            start = pos + 4
            pos = start + payload[pos + 3]
            correlation_id = str(payload[start:pos], "utf-8")
        else:
            return None
        if pos + len(content_type) != end or not payload.startswith(content_type, pos):
            return None
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return correlation_id, to, end


def binary_to_end(payload: bytes, pos: int) -> int | None:
    """Where the bytes of the binary at ``pos`` begin, if they end ``payload``; else None:
    the data section both layouts end with."""
    if payload[pos] == 0xA0:
        start = pos + 2
        size = payload[pos + 1]
    elif payload[pos] == 0xB0:
        start = pos + 5
        size = _UINT.unpack_from(payload, pos + 1)[0]
    else:
        return None
    return start if start + size == len(payload) else None
