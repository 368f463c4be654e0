"""The transfer frame's fast path: its common shapes read and written without the generic codec.

Nearly every frame of a busy link is a one-frame transfer: a described list of handle,
delivery-id, delivery-tag, message-format, settled and more, in the few encodings peers use for
them. The generic codec reads it through a dispatch per value, a decode budget and a copy of the
frame body, and writes it field by field through the class encoder; here both are one straight
function over the frame's bytes. Each side only takes the shapes it recognises and answers
None (``decode_transfer``) or defers to the generic codec (``encode_transfer_frame``) for any
other, so what the wire may carry, and every error for what it may not, stays the generic
codec's: a malformed transfer is never judged here, only left to it.
"""

from __future__ import annotations

import struct

from .codec import encode_into
from .link import MAX_DELIVERY_TAG
from .performatives import Transfer
from .scalars import UINT_SMALL, encode_uint
from .types import Buffer

__all__ = [
    "TRANSFER_PREFIX",
    "TRANSFER_WEIGHT",
    "decode_transfer",
    "encode_first_transfer",
    "encode_transfer_frame",
    "settled_whole",
]

TRANSFER_PREFIX = b"\x00\x53\x14"
"""A transfer's descriptor as nearly every peer writes it: the small ulong 0x14."""
TRANSFER_WEIGHT = 11
"""The values the generic decoder counts for a transfer against ``max_elements`` (its fields):
below that bound the generic decoder refuses every transfer, so the fast path must not run."""

_U_I = struct.Struct(">I").unpack_from
_U_II = struct.Struct(">II").unpack_from
_P_BI = struct.Struct(">BI").pack
_UINT_MAX = 0xFFFFFFFF
# The frame header, the descriptor and a list8 header (size and count), in one pack.
_P_HEAD = struct.Struct(">IBBH4sBB").pack
_LIST8_HEAD = TRANSFER_PREFIX + b"\xc0"
_pack_header = struct.Struct(">IBBH").pack_into
_VBIN8 = [bytes((0xA0, i)) for i in range(MAX_DELIVERY_TAG + 1)]
_BOOL = {0x40: False, 0x41: True, 0x42: False}  # resume, aborted, batchable: default false


def decode_transfer(buf: Buffer, off: int, end: int) -> tuple[Transfer, int] | None:
    """The transfer whose body starts at ``off`` (just past ``TRANSFER_PREFIX``) in a frame
    ending at ``end``, and the offset of its payload; None unless it is in a common shape.

    Common: a list8 or list32 of at most the 11 fields, handle and the uint fields as uint0,
    smalluint or uint (or null where allowed), the tag as vbin8, booleans as true/false/null,
    rcv-settle-mode and state null; the list's size and count agreeing with its content, and
    within the frame. Bytes past ``end`` may belong to the next frame: reading them only leads
    to a disagreement, hence None.
    """
    try:
        code = buf[off]
        if code == 0xC0:
            lend = off + 2 + buf[off + 1]
            n = buf[off + 2]
            p = off + 3
        elif code == 0xD0:
            size, n = _U_II(buf, off + 1)
            lend = off + 5 + size
            p = off + 9
        else:
            return None
        if lend > end or not 0 < n <= TRANSFER_WEIGHT:
            return None
        c = buf[p]  # handle: mandatory
        if c == 0x52:
            handle = buf[p + 1]
            p += 2
        elif c == 0x43:
            handle = 0
            p += 1
        elif c == 0x70:
            handle = _U_I(buf, p + 1)[0]
            p += 5
        else:
            return None
        delivery_id = tag = message_format = settled = None
        more = False
        if n > 1:
            c = buf[p]
            if c == 0x52:
                delivery_id = buf[p + 1]
                p += 2
            elif c == 0x70:
                delivery_id = _U_I(buf, p + 1)[0]
                p += 5
            elif c == 0x43:
                delivery_id = 0
                p += 1
            elif c == 0x40:
                p += 1
            else:
                return None
        if n > 2:
            c = buf[p]
            if c == 0xA0:
                tend = p + 2 + buf[p + 1]
                tag = bytes(buf[p + 2 : tend])
                p = tend
            elif c == 0x40:
                p += 1
            else:
                return None
        if n > 3:
            c = buf[p]
            if c == 0x43:
                message_format = 0
                p += 1
            elif c == 0x52:
                message_format = buf[p + 1]
                p += 2
            elif c == 0x70:
                message_format = _U_I(buf, p + 1)[0]
                p += 5
            elif c == 0x40:
                p += 1
            else:
                return None
        if n > 4:
            c = buf[p]
            if c == 0x41:
                settled = True
            elif c == 0x42:
                settled = False
            elif c != 0x40:
                return None
            p += 1
        if n > 5:
            c = buf[p]
            if c == 0x41:
                more = True
            elif c != 0x40 and c != 0x42:
                return None
            p += 1
        if n <= 6:
            if p != lend:
                return None
            return Transfer(handle, delivery_id, tag, message_format, settled, more), lend
        # rcv-settle-mode and state null; resume, aborted and batchable booleans
        flags = [False, False, False]
        for i in range(n - 6):
            c = buf[p + i]
            if i < 2:
                if c != 0x40:
                    return None
            else:
                flag = _BOOL.get(c)
                if flag is None:
                    return None
                flags[i - 2] = flag
        p += n - 6
        if p != lend:
            return None
        resume, aborted, batchable = flags
        transfer = Transfer(
            handle, delivery_id, tag, message_format, settled, more, None, None, resume, aborted,
            batchable,
        )  # fmt: skip
        return transfer, lend
    except (IndexError, struct.error):  # ran off the data: the generic codec says how
        return None


def _uint_at(buf: Buffer, p: int) -> tuple[int, int]:
    """The uint at ``p`` (uint0, smalluint or uint) and the offset past it; -1 for any other
    encoding."""
    c = buf[p]
    if c == 0x52:
        return buf[p + 1], p + 2
    if c == 0x43:
        return 0, p + 1
    if c == 0x70:
        return _U_I(buf, p + 1)[0], p + 5
    return -1, p


def settled_whole(buf: Buffer, off: int, end: int) -> tuple[int, int, int] | None:
    """(handle, delivery-id, offset of the payload) of the transfer whose body starts at
    ``off`` (just past ``TRANSFER_PREFIX``) in a frame ending at ``end``, if it carries a whole
    pre-settled message of format 0 in the usual shape: a list8 of the five fields up to
    settled, handle and delivery-id as uint0, smalluint or uint, a vbin8 tag of at most
    ``MAX_DELIVERY_TAG`` bytes, then uint0 and true. None for anything else, which
    ``decode_transfer`` and the session judge (a relay's pass-through takes only this)."""
    try:
        if buf[off] != 0xC0 or buf[off + 2] != 5:
            return None
        lend = off + 2 + buf[off + 1]
        handle, p = _uint_at(buf, off + 3)
        delivery_id, p = _uint_at(buf, p)
        if handle < 0 or delivery_id < 0 or buf[p] != 0xA0 or buf[p + 1] > MAX_DELIVERY_TAG:
            return None
        p += 2 + buf[p + 1]
        if p + 2 != lend or lend > end or buf[p] != 0x43 or buf[p + 1] != 0x41:
            return None
        return handle, delivery_id, lend
    except (IndexError, struct.error):  # ran off the data: not this shape
        return None


def encode_transfer_frame(
    out: bytearray, channel: int, transfer: Transfer, payload: bytes | bytearray | memoryview
) -> None:
    """Append the frame of ``transfer`` and its payload to ``out``: the very bytes the generic
    codec writes, without its per-field dispatch. Transfers with a rcv-settle-mode, a state,
    resume, aborted, batchable or a tag longer than ``MAX_DELIVERY_TAG`` (none of which we
    send) go through the generic encoder, behind the same frame header."""
    handle = transfer.handle
    delivery_id = transfer.delivery_id
    tag = transfer.delivery_tag
    message_format = transfer.message_format
    settled = transfer.settled
    if (
        transfer.rcv_settle_mode is not None
        or transfer.state is not None
        or transfer.resume
        or transfer.aborted
        or transfer.batchable
        or handle is None
        or (tag is not None and (type(tag) is not bytes or len(tag) > MAX_DELIVERY_TAG))
    ):
        start = len(out)
        out += bytes(8)  # placeholder header, patched below
        encode_into(transfer, out)
        out += payload
        size = len(out) - start
        if size > _UINT_MAX:
            raise ValueError("frame larger than 4 GiB")
        _pack_header(out, start, size, 2, 0, channel)
        return
    # a delivery's first frame, as ``Session.send`` writes it: every field up to settled
    if (
        not transfer.more
        and settled is not None
        and message_format is not None
        and tag
        and delivery_id is not None
    ):
        encode_first_transfer(
            out, channel, handle, delivery_id, tag, message_format, settled, payload
        )
        return
    # the rest: the last field written is the last one not null (``more`` false is null)
    if transfer.more:
        n = 6
    elif settled is not None:
        n = 5
    elif message_format is not None:
        n = 4
    elif tag is not None:
        n = 3
    elif delivery_id is not None:
        n = 2
    else:
        n = 1
    parts = [_uint(handle)]
    if n > 1:
        parts.append(b"\x40" if delivery_id is None else _uint(delivery_id))
    if n > 2:
        parts += (b"\x40",) if tag is None else (_VBIN8[len(tag)], tag)
    if n > 3:
        parts.append(b"\x40" if message_format is None else _uint(message_format))
    if n > 4:
        parts.append(b"\x40" if settled is None else b"\x41" if settled else b"\x42")
    if n > 5:
        parts.append(b"\x41")
    _put_list8(out, channel, b"".join(parts), n, payload)


def encode_first_transfer(
    out: bytearray,
    channel: int,
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool,
    payload: bytes | bytearray | memoryview,
) -> None:
    """Append a delivery's first frame with every field up to settled (``more`` false, a
    non-empty ``tag`` of at most ``MAX_DELIVERY_TAG`` bytes), as ``encode_transfer_frame``
    writes the transfer of those fields: how nearly every message goes out, written with no
    ``Transfer`` to build (a relay's pass-through, ``Connection.forward``)."""
    body = b"".join(
        (UINT_SMALL[handle] if 0 <= handle <= 255 else _uint(handle), _uint(delivery_id),
         _VBIN8[len(tag)], tag, b"\x43" if message_format == 0 else _uint(message_format),
         b"\x41" if settled else b"\x42")
    )  # fmt: skip
    _put_list8(out, channel, body, 5, payload)


def _put_list8(
    out: bytearray, channel: int, body: bytes, n: int, payload: bytes | bytearray | memoryview
) -> None:
    """Append a transfer frame whose performative is the list8 of ``n`` encoded fields ``body``
    (52 bytes at most), and its payload."""
    # frame header 8, descriptor 3, list8 header 3; a memoryview's length may count items
    size = 14 + len(body) + (payload.nbytes if type(payload) is memoryview else len(payload))
    if size > _UINT_MAX:
        raise ValueError("frame larger than 4 GiB")
    out += _P_HEAD(size, 2, 0, channel, _LIST8_HEAD, len(body) + 1, n)
    out += body
    out += payload


def _uint(v: int) -> bytes:
    """A uint as the generic codec writes it; out of range, its error."""
    if 0 <= v <= 255:
        return UINT_SMALL[v]
    if 0 < v <= _UINT_MAX:
        return _P_BI(0x70, v)
    encode_uint(v, bytearray())  # raises the generic codec's error for a value no uint holds
    raise AssertionError("unreachable")
