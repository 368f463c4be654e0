"""The one message layout a service reads for nearly every call, read in one pass.

Our client writes every request the same way (``wire.encode_request``): a header of a ttl
alone; properties of a ulong or string message-id, a string reply-to, the same id again as
correlation-id, maybe a content-type, and an absolute-expiry-time last; application-properties;
one data section. :func:`read_usual` checks each byte of the header and properties that the
generic decoder would read, and returns their fields and where the two sections after them
begin; None for anything else, which the generic path then decodes, or refuses, as ever.

It builds no section objects: ``Message.decode`` makes its ``Message`` from what it returns,
and a service (``wire.read_request``) its request, without a message at all.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any, NamedTuple

from pairlink._amqp.codec import DECODE_FAULTS, DECODERS
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.types import Symbol

USUAL_HEADER = b"\x00\x53\x70\xc0\x08\x03\x40\x40\x70"
"""The header of a uint ttl alone (durable and priority null, the rest left out): 13 bytes
with the ttl."""
_PROPERTIES_9 = b"\x00\x53\x73\xc0"  # the properties as a list8 (its size, then 9 fields)
_U_I = struct.Struct(">I").unpack_from
_U_Q = struct.Struct(">q").unpack_from
_ID_DECODERS = {c: DECODERS[c] for c in (0x44, 0x53, 0x80)}  # ulong ids, wrapped as ever
_ID_SIZES = {0x44: 1, 0x53: 2, 0x80: 9}
_FAULTS = (DecodeError, *DECODE_FAULTS)
_SYMBOLS: dict[bytes, Symbol] = {}  # content-types by their encoding: a handful, repeated
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)
FIRST_MS = (datetime.datetime.min.replace(tzinfo=datetime.UTC) - _EPOCH) // _ONE_MS
LAST_MS = (datetime.datetime.max.replace(tzinfo=datetime.UTC) - _EPOCH) // _ONE_MS
"""The timestamps (ms since the epoch) a ``datetime`` holds: the decoder refuses any other."""


class UsualRequest(NamedTuple):
    """The fields of a request in the usual layout, and where its last two sections begin."""

    ttl: int
    message_id: Any  # a str, or a ulong as the decoder wraps it
    reply_to: str
    content_type: Symbol | None
    expiry_ms: int  # the absolute-expiry-time, within FIRST_MS..LAST_MS
    sections: int  # the offset of the application-properties section (its descriptor)


def read_usual(payload: bytes) -> UsualRequest | None:
    """The header and properties of ``payload`` if it is a request in the usual layout (see
    the module), else None. The sections after them are the caller's to check and read."""
    try:
        if not payload.startswith(USUAL_HEADER) or not payload.startswith(_PROPERTIES_9, 13):
            return None
        if payload[18] != 9:
            return None
        props_end = 18 + payload[17]
        code = payload[19]
        if code == 0xA1:  # the message-id: a string ...
            mid_end = 21 + payload[20]
            message_id: Any = str(payload[21:mid_end], "utf-8")
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
        elif payload[end] == 0x40:
            pos = end + 1
        else:
            return None
        if pos + 10 != props_end or not payload.startswith(b"\x40\x83", pos):
            return None  # content-encoding: null; the expiry: the last field
        expiry_ms = _U_Q(payload, pos + 2)[0]
        if not FIRST_MS <= expiry_ms <= LAST_MS:
            return None
    except _FAULTS:
        return None
    return UsualRequest(
        _U_I(payload, 9)[0], message_id, reply_to, content_type, expiry_ms, pos + 10
    )
