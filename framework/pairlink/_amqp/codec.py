"""Encoder and decoder of the AMQP 1.0 type system (types.xml).

This is the hot path of every frame, so the shape is chosen for CPython speed: encoding looks the
value's type up in one dict and appends to a caller-owned ``bytearray``; decoding dispatches on
the constructor byte through a 256-entry table of ``(buf, offset, depth) -> (value, offset)``
functions over ``bytes``/``memoryview`` without copying.

Malformed input of any kind surfaces as ``DecodeError``: sizes and counts are checked against the
data before anything is allocated, nesting is capped, so is the number of values one decode may
build (``MAX_ELEMENTS``), and the few low-level errors a truncated buffer can still raise are
translated at the public entry points. Whatever decodes encodes again.

The scalar types (fixed and variable width: numbers, strings, binary...) are encoded and decoded
one value at a time in scalars.py; this module has the compound ones (lists, maps, arrays,
described values), the dispatch tables over all of them, the bounds of a decode and the public
entry points. Described classes (``@composite``/``@restricted``) are compiled in described.py,
from the encoders and decoders of both, and registered here (``register_class``): by type in
``ENCODERS`` and by descriptor in ``CLASS_DECODERS``, which is all this module needs to encode
and decode them. The names described.py builds from are public (it imports no private name);
nothing here imports described.py, so there is no cycle.
"""

from __future__ import annotations

import datetime
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn, Protocol, TypeAlias

from pairlink._amqp.errors import DecodeError
from pairlink._amqp.scalars import (
    PLAIN_SCALARS,
    Decoder,
    Encoder,
    encode_binary,
    encode_bool,
    encode_byte,
    encode_char,
    encode_decimal32,
    encode_decimal64,
    encode_decimal128,
    encode_double,
    encode_float,
    encode_int,
    encode_long,
    encode_null,
    encode_short,
    encode_string,
    encode_symbol,
    encode_timestamp,
    encode_ubyte,
    encode_uint,
    encode_ulong,
    encode_ushort,
    encode_uuid,
    overrun,
)
from pairlink._amqp.types import (
    Array,
    Buffer,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Decoded,
    Described,
    Float32,
    Int,
    Long,
    Short,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
)

MAX_DEPTH = 64
"""Deepest nesting of lists/maps/arrays/described values accepted (bounds recursion)."""

MAX_ELEMENTS = 1 << 17
"""Most values one decode (a frame's performative, a whole message) may build: the items of its
lists, maps and arrays, and a composite's fields where a list, map or array holds composites,
counted as each compound starts.

Sizes already stop a count from outrunning the bytes, but one byte can still become an object
of 50-150 bytes and a microsecond of work (a 2-byte described array element is two objects), so
without this an 8 MiB body held ~700 MiB and the event loop for seconds. 131,072 values is more
than any request or reply we have seen needs; the costliest kinds measured here at the bound
took under 100 ms and 8 MiB. Callers pass ``max_elements`` to choose another bound."""


class _Budget(threading.local):
    """What the decode running on this thread may still build, ``cell = [left, limit]``: a
    thread's own, since decoders run on whatever thread calls them; one thread-local read per
    compound (a list cell, because a thread-local write would be a second lookup)."""

    def __init__(self) -> None:
        self.cell = [MAX_ELEMENTS, MAX_ELEMENTS]


_BUDGET = _Budget()


def _over_budget() -> DecodeError:
    return DecodeError(f"more than {_BUDGET.cell[1]} values in one frame or message")


def start_budget(max_elements: int = MAX_ELEMENTS) -> None:
    """Begin a decode of several values that share one ``max_elements`` (a message's sections):
    ``decode_from`` starts afresh at each call, ``decode_more`` does not."""
    cell = _BUDGET.cell
    cell[0] = cell[1] = max_elements


_P_BII = struct.Struct(">BII").pack
_P_II = struct.Struct(">II").pack
_U_II = struct.Struct(">II").unpack_from


# ---------------------------------------------------------------------------------- encoding


def _finish(out: bytearray, pos: int, count: int, code8: int) -> None:
    """Patch the 8-bit header reserved at ``pos``, or widen it in place when it does not fit."""
    size = len(out) - pos - 2
    if size <= 0xFF and count <= 0xFF:
        out[pos + 1] = size
        out[pos + 2] = count
    else:
        out[pos : pos + 3] = _P_BII(code8 + 0x10, size + 3, count)


class Pairs(Protocol):
    """What a map encoder takes: a mapping read once, by ``items()`` and ``len()``. Not
    ``Mapping[object, object]``, whose key type is invariant: that would refuse a
    ``dict[str, int]``."""

    def items(self) -> Iterable[tuple[object, object]]: ...

    def __len__(self) -> int: ...


def encode_list(v: Sequence[object], out: bytearray) -> None:
    if not v:
        out.append(0x45)
        return
    pos = len(out)
    out += b"\xc0\x00\x00"
    encs = ENCODERS
    for item in v:
        (encs.get(type(item)) or resolve_encoder(type(item)))(item, out)
    _finish(out, pos, len(v), 0xC0)


def encode_map(v: Pairs, out: bytearray) -> None:
    pos = len(out)
    out += b"\xc1\x00\x00"
    encs = ENCODERS
    for key, item in v.items():
        (encs.get(type(key)) or resolve_encoder(type(key)))(key, out)
        (encs.get(type(item)) or resolve_encoder(type(item)))(item, out)
    _finish(out, pos, 2 * len(v), 0xC1)


def encode_fields(v: Pairs, out: bytearray) -> None:
    """A map whose plain ``str`` keys go out as symbols (fields, annotations, filter-set)."""
    pos = len(out)
    out += b"\xc1\x00\x00"
    encs = ENCODERS
    for key, item in v.items():
        if type(key) is str:
            encode_symbol(key, out)
        else:
            (encs.get(type(key)) or resolve_encoder(type(key)))(key, out)
        (encs.get(type(item)) or resolve_encoder(type(item)))(item, out)
    _finish(out, pos, 2 * len(v), 0xC1)


def encode_descriptor(d: object, out: bytearray) -> None:
    if isinstance(d, int) and not isinstance(d, bool):
        encode_ulong(d, out)
    elif isinstance(d, str):
        encode_symbol(d, out)
    else:
        encode_into(d, out)


def _e_described(v: Described, out: bytearray) -> None:
    out.append(0x00)
    encode_descriptor(v.descriptor, out)
    encode_into(v.value, out)


# Array elements share one constructor: each is encoded alone, then moved along its "widening
# chain" (uint0 -> smalluint -> uint, str8 -> str32, ...) to the narrowest common constructor.
_NEXT = {0x43: 0x52, 0x52: 0x70, 0x44: 0x53, 0x53: 0x80, 0x54: 0x71, 0x55: 0x81, 0x41: 0x56,
         0x42: 0x56, 0xA0: 0xB0, 0xA1: 0xB1, 0xA3: 0xB3, 0x45: 0xC0, 0xC0: 0xD0, 0xC1: 0xD1,
         0xE0: 0xF0}  # fmt: skip
_ZERO_WIDTH = frozenset((0x40, 0x41, 0x42, 0x43, 0x44, 0x45))


def _widen_var(p: bytes) -> bytes:
    return p[0].to_bytes(4, "big") + p[1:]


def _widen_compound(p: bytes) -> bytes:
    return _P_II(p[0] + 3, p[1]) + p[2:]


def _sign_pad(n: int) -> Callable[[bytes], bytes]:
    return lambda p: (b"\xff" * n if p[0] & 0x80 else b"\x00" * n) + p


_WIDEN: dict[int, Callable[[bytes], bytes]] = {
    0x43: lambda p: b"\x00", 0x52: lambda p: b"\x00" * 3 + p,
    0x44: lambda p: b"\x00", 0x53: lambda p: b"\x00" * 7 + p,
    0x54: _sign_pad(3), 0x55: _sign_pad(7),
    0x41: lambda p: b"\x01", 0x42: lambda p: b"\x00",
    0xA0: _widen_var, 0xA1: _widen_var, 0xA3: _widen_var,
    0x45: lambda p: b"\x01\x00", 0xC0: _widen_compound, 0xC1: _widen_compound,
    0xE0: _widen_compound,
}  # fmt: skip


def _chain(code: int) -> list[int]:
    out = [code]
    while code in _NEXT:
        code = _NEXT[code]
        out.append(code)
    return out


def _split(enc: bytearray) -> tuple[bytes, int, bytes]:
    """Split one encoded value into (descriptor prefix, format code, payload)."""
    i = 0
    while enc[i] == 0x00:
        _, i = decode_from(enc, i + 1)
    return bytes(enc[:i]), enc[i], bytes(enc[i + 1 :])


def encode_array(v: Sequence[object], out: bytearray) -> None:
    forced: int | None = getattr(v, "element_code", None)
    if not v:
        out += bytes((0xE0, 2, 0, 0x40 if forced is None else forced))
        return
    parts: list[tuple[bytes, int, bytes]] = []
    for item in v:
        tmp = bytearray()
        encode_into(item, tmp)
        parts.append(_split(tmp))
    prefix = parts[0][0]
    if any(p[0] != prefix for p in parts):
        raise ValueError("array elements must share one descriptor")
    common = _chain(parts[0][1])
    for p in parts:
        chain = _chain(p[1])
        common = [c for c in common if c in chain]
    if forced is not None:
        if forced not in common:
            raise ValueError(f"array elements cannot all be written with 0x{forced:02x}")
        target = forced
    elif not common:
        raise ValueError("array elements must share one AMQP type")
    else:
        target = next((c for c in common if c not in _ZERO_WIDTH), common[-1])
    body = bytearray(prefix)
    body.append(target)
    for _, code, payload in parts:
        while code != target:
            payload = _WIDEN[code](payload)
            code = _NEXT[code]
        body += payload
    count = len(parts)
    if len(body) < 0xFF and count <= 0xFF:
        out += bytes((0xE0, len(body) + 1, count))
    else:
        out += _P_BII(0xF0, len(body) + 4, count)
    out += body


ENCODERS: dict[type, Encoder] = {
    type(None): encode_null, bool: encode_bool, int: encode_long, float: encode_double,
    str: encode_string, bytes: encode_binary, bytearray: encode_binary,
    memoryview: encode_binary, list: encode_list, tuple: encode_list, dict: encode_map,
    Symbol: encode_symbol, Char: encode_char, UByte: encode_ubyte, UShort: encode_ushort,
    UInt: encode_uint, ULong: encode_ulong, Byte: encode_byte, Short: encode_short,
    Int: encode_int, Long: encode_long, Float32: encode_float, Decimal32: encode_decimal32,
    Decimal64: encode_decimal64, Decimal128: encode_decimal128,
    datetime.datetime: encode_timestamp, uuid.UUID: encode_uuid, Array: encode_array,
    Described: _e_described,
}  # fmt: skip


def resolve_encoder(t: type) -> Encoder:
    """Find (and cache) the encoder of a subclass of a supported type, e.g. an ``IntEnum``."""
    for base in t.__mro__[1:]:
        enc = ENCODERS.get(base)
        if enc is not None:
            ENCODERS[t] = enc
            return enc
    raise TypeError(f"cannot encode a {t.__qualname__} as AMQP")


def encode_into(value: object, out: bytearray) -> None:
    """Append the smallest AMQP encoding of ``value`` to ``out`` (type chosen by Python type)."""
    (ENCODERS.get(type(value)) or resolve_encoder(type(value)))(value, out)


def encode(value: object) -> bytes:
    """The AMQP encoding of ``value`` as ``bytes``."""
    out = bytearray()
    encode_into(value, out)
    return bytes(out)


# ---------------------------------------------------------------------------------- decoding
# Compound payload decoders, shaped as scalars.py's.


def _bad_compound(buf: Buffer, off: int, end: int, count: int) -> DecodeError:
    if end > len(buf):
        return overrun(buf, end)
    if count > end - off:
        return DecodeError(f"count {count} cannot fit in {end - off} byte(s)")
    return DecodeError(f"nesting deeper than {MAX_DEPTH}")


def _items(
    buf: Buffer, off: int, end: int, count: int, depth: int, dec: list[Decoder]
) -> tuple[list[Decoded], int]:
    # Size within the data, count within the size (every item takes a byte), depth capped.
    if end > len(buf) or count > end - off or depth >= MAX_DEPTH:
        raise _bad_compound(buf, off, end, count)
    cell = _BUDGET.cell
    left = cell[0] - count
    if left < 0:
        raise _over_budget()
    cell[0] = left
    depth += 1
    items: list[Decoded] = []
    append = items.append
    for _ in range(count):
        v, off = dec[buf[off]](buf, off + 1, depth)
        append(v)
    if off != end:
        raise DecodeError("list size disagrees with its content")
    return items, off


def _d_list0(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
    return [], off


def _d_list8(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
    return _items(buf, off + 2, off + 1 + buf[off], buf[off + 1], depth, DECODERS)


def _d_list32(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
    size, count = _U_II(buf, off)
    return _items(buf, off + 8, off + 4 + size, count, depth, DECODERS)


def list_decoders(items: list[Decoder]) -> dict[int, Decoder]:
    """Payload decoders (by constructor) of a list whose items ``items`` decodes, a table of
    256 by constructor as ``DECODERS`` is: a list of one type, each item checked as it is
    read, with the same bounds as any list."""

    def d8(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
        return _items(buf, off + 2, off + 1 + buf[off], buf[off + 1], depth, items)

    def d32(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
        size, count = _U_II(buf, off)
        return _items(buf, off + 8, off + 4 + size, count, depth, items)

    return {0x45: _d_list0, 0xC0: d8, 0xD0: d32}


def _pairs(
    buf: Buffer, off: int, end: int, count: int, depth: int
) -> tuple[dict[Decoded, Decoded], int]:
    # Size within the data, count within the size (every item takes a byte), depth capped.
    if end > len(buf) or count > end - off or depth >= MAX_DEPTH:
        raise _bad_compound(buf, off, end, count)
    if count & 1:
        raise DecodeError("map has an odd number of items")
    cell = _BUDGET.cell
    left = cell[0] - count
    if left < 0:
        raise _over_budget()
    cell[0] = left
    depth += 1
    dec = DECODERS
    result: dict[Decoded, Decoded] = {}
    for _ in range(count >> 1):
        k, off = dec[buf[off]](buf, off + 1, depth)
        v, off = dec[buf[off]](buf, off + 1, depth)
        try:
            result[k] = v
        except TypeError:
            raise DecodeError("map key is not hashable") from None
    if off != end:
        raise DecodeError("map size disagrees with its content")
    if 2 * len(result) != count:
        raise DecodeError("map has duplicate keys")
    return result, off


# What a remembered map may hold: values no holder of the map can change.
_IMMUTABLE = frozenset((str, Symbol, Char, bytes, bool, int, float, type(None), UByte, UShort,
                        UInt, ULong, Byte, Short, Int, Long, Float32, datetime.datetime,
                        uuid.UUID))  # fmt: skip
_MEMO_SIZE = 256


def memoized_maps(dec: ClassDecoder) -> ClassDecoder:
    """``dec``, the decoder of a map section, remembering the last few maps8 of immutable keys
    and values it decoded by their encoding: a copy of the map comes back when the same bytes
    do (an RPC's application-properties mostly repeat: one operation name, one status), so
    they are decoded once. The copy counts against the decode's budget as the map would.

    Only a ``bytes`` buffer is looked up (a slice of it is the key); the memo is cleared when
    full, so bytes that never repeat cost one lookup and one insertion each."""
    memo: dict[bytes, dict[Decoded, Decoded]] = {}
    immutable = _IMMUTABLE

    def d(code: int, buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
        if code != 0xC1 or type(buf) is not bytes:
            return dec(code, buf, off, depth)
        end = off + 1 + buf[off]
        key = buf[off:end]  # a truncated one is shorter than a remembered one of its size
        hit = memo.get(key)
        if hit is not None:
            cell = _BUDGET.cell
            left = cell[0] - 2 * len(hit)
            if left < 0:
                raise _over_budget()
            cell[0] = left
            return hit.copy(), end
        value, off = dec(code, buf, off, depth)
        for k, v in value.items():
            if type(k) not in immutable or type(v) not in immutable:
                return value, off
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = value.copy()
        return value, off

    return d


def _d_map8(buf: Buffer, off: int, depth: int) -> tuple[dict[Decoded, Decoded], int]:
    return _pairs(buf, off + 2, off + 1 + buf[off], buf[off + 1], depth)


def _d_map32(buf: Buffer, off: int, depth: int) -> tuple[dict[Decoded, Decoded], int]:
    size, count = _U_II(buf, off)
    return _pairs(buf, off + 8, off + 4 + size, count, depth)


def _array(buf: Buffer, off: int, end: int, count: int, depth: int) -> tuple[Array[Decoded], int]:
    if end > len(buf):
        raise overrun(buf, end)
    if depth >= MAX_DEPTH:
        raise DecodeError(f"nesting deeper than {MAX_DEPTH}")
    depth += 1
    descriptors: list[int | Symbol] = []
    code = buf[off]
    off += 1
    while code == 0x00:
        d, off = decode_descriptor(buf, off, depth)
        descriptors.append(d)
        code = buf[off]
        off += 1
    if code not in _ELEMENT_CODES:
        raise DecodeError(f"constructor 0x{code:02x} is not a valid array element type")
    # Zero-width elements take no bytes, so bound their count by a fixed amplification instead.
    if count > (8 * (end - off + 1) if code in _ZERO_WIDTH else end - off):
        raise DecodeError(f"array count {count} cannot fit in its {end - off} byte(s)")
    inner = CLASS_DECODERS.get(descriptors[-1]) if descriptors else None
    # each element is its value (and a class instance's fields), plus a ``Described`` for each
    # descriptor no class takes
    per = len(descriptors) + (_CLASS_WEIGHT[descriptors[-1]] if inner is not None else 1)
    cell = _BUDGET.cell
    left = cell[0] - count * per
    if left < 0:
        raise _over_budget()
    cell[0] = left
    items: Array[Decoded] = Array(element_code=code)
    append = items.append
    if inner is not None:
        for _ in range(count):
            v, off = inner(code, buf, off, depth)
            append(v)
    else:
        dec = DECODERS[code]
        for _ in range(count):
            v, off = dec(buf, off, depth)
            append(v)
    if descriptors:
        outer = descriptors if inner is None else descriptors[:-1]
        for i, v in enumerate(items):
            for d in reversed(outer):
                v = Described(d, v)
            items[i] = v
    if off != end:
        raise DecodeError("array size disagrees with its content")
    return items, off


def _d_array8(buf: Buffer, off: int, depth: int) -> tuple[Array[Decoded], int]:
    return _array(buf, off + 2, off + 1 + buf[off], buf[off + 1], depth)


def _d_array32(buf: Buffer, off: int, depth: int) -> tuple[Array[Decoded], int]:
    size, count = _U_II(buf, off)
    return _array(buf, off + 8, off + 4 + size, count, depth)


def decode_descriptor(buf: Buffer, off: int, depth: int) -> tuple[int | Symbol, int]:
    """A descriptor: a ulong (as a plain ``int``) or a symbol. Part 1 §1.5 reserves any other
    type, and only these two encode back as descriptors, so the rest is a decode error."""
    desc, off = DECODERS[buf[off]](buf, off + 1, depth)
    t = type(desc)
    if t is ULong:
        return int(desc), off
    if t is not Symbol:
        raise DecodeError(f"a descriptor must be a ulong or a symbol, not {t.__name__}")
    return desc, off


def _d_described(buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
    if depth >= MAX_DEPTH:
        raise DecodeError(f"nesting deeper than {MAX_DEPTH}")
    depth += 1
    if buf[off] == 0x53:  # the usual small ulong descriptor: skip the generic path
        desc: int | Symbol = buf[off + 1]
        off += 2
    else:
        desc, off = decode_descriptor(buf, off, depth)
    cdec = CLASS_DECODERS.get(desc)
    # a class's fields, or a ``Described`` with its descriptor and value, wherever a described
    # value may stand (a list of them would otherwise be counted one value each)
    cell = _BUDGET.cell
    left = cell[0] - (_UNCLASSED_WEIGHT if cdec is None else _CLASS_WEIGHT[desc])
    if left < 0:
        raise _over_budget()
    cell[0] = left
    if cdec is not None:
        return cdec(buf[off], buf, off + 1, depth)
    value, off = DECODERS[buf[off]](buf, off + 1, depth)
    return Described(desc, value), off


def _wrap(cls: type[int], plain: Decoder) -> Decoder:
    new = int.__new__

    def dec(buf: Buffer, off: int, depth: int) -> tuple[int, int]:
        v, off = plain(buf, off, depth)
        return new(cls, v), off

    return dec


def invalid_constructor(code: int, what: str = "AMQP value") -> Decoder:
    def dec(buf: Buffer, off: int, depth: int) -> NoReturn:
        raise DecodeError(f"constructor 0x{code:02x} is not a valid {what}")

    return dec


# Plain decoders per AMQP type name (codes accepted for that type -> payload decoder).
PLAIN_DECODERS: dict[str, dict[int, Decoder]] = {
    **PLAIN_SCALARS,
    "list": {0x45: _d_list0, 0xC0: _d_list8, 0xD0: _d_list32},
    "map": {0xC1: _d_map8, 0xD1: _d_map32},
    "array": {0xE0: _d_array8, 0xF0: _d_array32},
}
# Plain ``int`` already encodes as ``long``, so ``long`` decodes unwrapped (cheaper, same wire).
_WRAPPERS: dict[str, type[int]] = {"ubyte": UByte, "ushort": UShort, "uint": UInt, "ulong": ULong,
                              "byte": Byte, "short": Short, "int": Int}  # fmt: skip

DECODERS: list[Decoder] = [invalid_constructor(c) for c in range(256)]
for _name, _codes in PLAIN_DECODERS.items():
    for _code, _plain in _codes.items():
        DECODERS[_code] = _wrap(_WRAPPERS[_name], _plain) if _name in _WRAPPERS else _plain
DECODERS[0x00] = _d_described
_ELEMENT_CODES = frozenset(c for codes in PLAIN_DECODERS.values() for c in codes)
"""Constructors an array's elements may share (every primitive one; descriptors come before)."""

# Described-class decoders, keyed by ulong code and by symbolic name (filled by described.py):
# ``(format_code, buf, off, depth) -> (instance, off)`` with ``off`` just past the format code.
ClassDecoder: TypeAlias = Callable[[int, Buffer, int, int], tuple[Decoded, int]]
CLASS_DECODERS: dict[int | str, ClassDecoder] = {}
_CLASS_WEIGHT: dict[int | str, int] = {}
"""Values an instance builds besides itself (a composite's declared fields), by descriptor."""
_UNCLASSED_WEIGHT = 3  # a ``Described`` of no class: itself, its descriptor and its value


def register_class(
    cls: type, descriptors: tuple[int | str, ...], enc: Encoder, dec: ClassDecoder, weight: int
) -> None:
    """Encode ``cls`` with ``enc``; decode a value described by any of ``descriptors`` (its
    code and name) with ``dec``, counting ``weight`` values besides the instance itself
    against the decode's ``max_elements``."""
    ENCODERS[cls] = enc
    for descriptor in descriptors:
        CLASS_DECODERS[descriptor] = dec
        _CLASS_WEIGHT[descriptor] = weight


def skip_values(buf: Buffer, off: int, n: int, depth: int) -> int:
    """Step over ``n`` values (a composite's trailing fields from a newer peer: the spec says
    to ignore them), counted against the decode's budget; the offset just past them."""
    cell = _BUDGET.cell
    left = cell[0] - n
    if left < 0:
        raise _over_budget()
    cell[0] = left
    for _ in range(n):
        _, off = DECODERS[buf[off]](buf, off + 1, depth)
    return off


def decode_from(
    buf: Buffer, offset: int = 0, max_elements: int = MAX_ELEMENTS
) -> tuple[Decoded, int]:
    """Decode one value starting at ``offset``; return it and the offset just past it.

    ``max_elements`` bounds the values it may build (``MAX_ELEMENTS``)."""
    start_budget(max_elements)
    return decode_more(buf, offset)


def decode_more(buf: Buffer, offset: int) -> tuple[Decoded, int]:
    """``decode_from`` within the budget ``start_budget`` began (the next of several values)."""
    try:
        return DECODERS[buf[offset]](buf, offset + 1, 0)
    except DECODE_FAULTS as exc:
        raise as_decode_error(exc) from None


# What the decoders raise on bad input besides ``DecodeError`` (they index and unpack the
# buffer without checking bounds first, and let the standard constructors reject bad values).
DECODE_FAULTS = (IndexError, struct.error, ValueError, OverflowError, TypeError)


def as_decode_error(exc: BaseException) -> DecodeError:
    """The ``DecodeError`` for one of ``DECODE_FAULTS`` raised while decoding.

    Public so that a caller inlining ``decode_from`` (``Message.decode``) reports bad input
    in the very same words.
    """
    if isinstance(exc, (IndexError, struct.error)):
        return DecodeError(f"truncated AMQP value ({exc})")
    return DecodeError(f"malformed AMQP value ({exc})")


def decode(buf: Buffer, max_elements: int = MAX_ELEMENTS) -> Decoded:
    """Decode exactly one value that fills ``buf``; trailing bytes are a ``DecodeError``."""
    value, end = decode_from(buf, 0, max_elements)
    if end != len(buf):
        raise DecodeError(f"{len(buf) - end} trailing byte(s) after the value")
    return value
