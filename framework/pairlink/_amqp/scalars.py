"""Encoders and decoders of the AMQP scalar types: the fixed-width and variable-width encodings
(types.xml), every primitive that holds no other value.

Each is one value at a time and knows nothing of nesting, budgets or described values, which
are codec.py's: it builds its encoder and decoder tables from the public names here, and
described.py builds class codecs from them too (the three modules are one codec in three
files). Nothing here imports either, so there is no cycle.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

from pairlink._amqp.errors import DecodeError
from pairlink._amqp.types import (
    Buffer,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Decoded,
    Float32,
    Symbol,
)

Encoder: TypeAlias = Callable[[Any, bytearray], None]
"""An encoder as the dispatch tables hold it (``ENCODERS`` by Python type, the composites' by
field type): each takes the values of its own type, precise in its own signature, but a table
cannot tie its values' parameter to its keys, so the table's entry takes ``Any``."""
Decoder: TypeAlias = Callable[[Buffer, int, int], tuple[Decoded, int]]
"""A payload decoder: ``(buf, off, depth) -> (value, new_off)``, ``off`` just past the
constructor byte (see below)."""

_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)

_P_BI = struct.Struct(">BI").pack
_U_I = struct.Struct(">I").unpack_from
_U_q = struct.Struct(">q").unpack_from

# Ready-made two-byte encodings: one table index instead of a pack call for small values.
UINT_SMALL = [b"\x43"] + [bytes((0x52, i)) for i in range(1, 256)]
_ULONG_SMALL = [b"\x44"] + [bytes((0x53, i)) for i in range(1, 256)]
_UBYTE = [bytes((0x50, i)) for i in range(256)]
_LONG_SMALL = [bytes((0x55, i & 0xFF)) for i in range(-128, 128)]
_INT_SMALL = [bytes((0x54, i & 0xFF)) for i in range(-128, 128)]
_VBIN8 = [bytes((0xA0, i)) for i in range(256)]
_STR8 = [bytes((0xA1, i)) for i in range(256)]
_SYM8 = [bytes((0xA3, i)) for i in range(256)]


def _bad(kind: str, value: object) -> ValueError:
    return ValueError(f"cannot encode {value!r} as AMQP {kind}")


# ---------------------------------------------------------------------------------- encoding


def encode_null(v: None, out: bytearray) -> None:
    out.append(0x40)


def encode_bool(v: object, out: bytearray) -> None:
    out.append(0x41 if v else 0x42)


def _packer(code: int, fmt: str, kind: str) -> Encoder:
    """Encoder of a fixed-width type with one encoding; struct checks the range."""
    pack = struct.Struct(">B" + fmt).pack

    def enc(v: float, out: bytearray) -> None:
        try:
            out += pack(code, v)
        except struct.error:
            raise _bad(kind, v) from None

    return enc


def _ranged(small: list[bytes], bias: int, code: int, fmt: str, kind: str) -> Encoder:
    """Encoder of an integer type with a one-byte (or empty) form for small values."""
    pack = struct.Struct(">B" + fmt).pack
    lo, hi = -bias, len(small) - 1 - bias

    def enc(v: int, out: bytearray) -> None:
        if lo <= v <= hi:
            out += small[v + bias]
            return
        try:
            out += pack(code, v)
        except struct.error:
            raise _bad(kind, v) from None

    return enc


def _raw(code: int) -> Encoder:
    """Encoder of a decimal type, whose exact bytes the value keeps."""

    def enc(v: Decimal32 | Decimal64 | Decimal128, out: bytearray) -> None:
        out.append(code)
        out += v.raw

    return enc


encode_ubyte = _ranged(_UBYTE, 0, 0x50, "B", "ubyte")
encode_ushort = _packer(0x60, "H", "ushort")
encode_uint = _ranged(UINT_SMALL, 0, 0x70, "I", "uint")
encode_ulong = _ranged(_ULONG_SMALL, 0, 0x80, "Q", "ulong")
encode_byte = _packer(0x51, "b", "byte")
encode_short = _packer(0x61, "h", "short")
encode_int = _ranged(_INT_SMALL, 128, 0x71, "i", "int")
encode_long = _ranged(_LONG_SMALL, 128, 0x81, "q", "long")
encode_float = _packer(0x72, "f", "float")
encode_double = _packer(0x82, "d", "double")
encode_decimal32 = _raw(0x74)
encode_decimal64 = _raw(0x84)
encode_decimal128 = _raw(0x94)
_e_utf32 = _packer(0x73, "I", "char")
_e_ms64 = _packer(0x83, "q", "timestamp")


def encode_char(v: str, out: bytearray) -> None:
    if len(v) != 1:
        raise _bad("char", v)
    _e_utf32(ord(v), out)


def encode_timestamp(v: datetime.datetime | int, out: bytearray) -> None:
    if isinstance(v, datetime.datetime):
        v = ((v.replace(tzinfo=_UTC) if v.tzinfo is None else v) - _EPOCH) // _ONE_MS
    _e_ms64(v, out)


def encode_uuid(v: uuid.UUID, out: bytearray) -> None:
    out.append(0x98)
    out += v.bytes


def encode_binary(v: Buffer, out: bytearray) -> None:
    if type(v) is memoryview and (v.format != "B" or v.ndim != 1):
        v = v.cast("B")
    n = len(v)
    out += _VBIN8[n] if n <= 0xFF else _P_BI(0xB0, n)
    out += v


def encode_string(v: str, out: bytearray) -> None:
    b = v.encode()
    n = len(b)
    out += _STR8[n] if n <= 0xFF else _P_BI(0xB1, n)
    out += b


def encode_symbol(v: str, out: bytearray) -> None:
    b = v.encode("ascii")
    n = len(b)
    out += _SYM8[n] if n <= 0xFF else _P_BI(0xB3, n)
    out += b


# ---------------------------------------------------------------------------------- decoding
# Payload decoders: ``(buf, off, depth) -> (value, new_off)`` with ``off`` just past the
# constructor byte. The "plain" ones return built-in values (typed composite fields use them);
# codec.py's generic table wraps them so a decoded value re-encodes as the same AMQP type.


def overrun(buf: Buffer, end: int) -> DecodeError:
    """The error for a declared size that runs past the end of ``buf``."""
    return DecodeError(f"declared size runs {end - len(buf)} byte(s) past the data")


def _const(value: object) -> Decoder:
    """Decoder of a zero-width encoding (null, true, false, uint0, ulong0, list0)."""

    def dec(buf: Buffer, off: int, depth: int) -> tuple[object, int]:
        return value, off

    return dec


decode_null, _d_zero = _const(None), _const(0)


def _d_bool(buf: Buffer, off: int, depth: int) -> tuple[bool, int]:
    b = buf[off]
    if b > 1:
        raise DecodeError(f"boolean byte must be 0 or 1, got {b}")
    return b == 1, off + 1


def _d_u8(buf: Buffer, off: int, depth: int) -> tuple[int, int]:
    return buf[off], off + 1


def _unpacker(fmt: str, cls: type[float] | None = None) -> Decoder:
    """Decoder of a fixed-width number (struct raises on a short buffer)."""
    st = struct.Struct(">" + fmt)
    unpack, n = st.unpack_from, st.size
    if cls is None:

        def dec(buf: Buffer, off: int, depth: int) -> tuple[float, int]:
            return unpack(buf, off)[0], off + n

        return dec

    def dec_cls(buf: Buffer, off: int, depth: int) -> tuple[float, int]:
        return cls(unpack(buf, off)[0]), off + n

    return dec_cls


def _fixed(cls: Callable[[bytes], object], n: int) -> Decoder:
    """Decoder of a fixed-width value built from its raw bytes (uuid, decimals)."""

    def dec(buf: Buffer, off: int, depth: int) -> tuple[object, int]:
        end = off + n
        if end > len(buf):
            raise overrun(buf, end)
        return cls(bytes(buf[off:end])), end

    return dec


def _d_char(buf: Buffer, off: int, depth: int) -> tuple[Char, int]:
    cp = _U_I(buf, off)[0]
    if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
        raise DecodeError(f"char 0x{cp:x} is not a Unicode scalar value")
    return Char(chr(cp)), off + 4


_TIMEDELTA = datetime.timedelta


def _d_timestamp(buf: Buffer, off: int, depth: int) -> tuple[datetime.datetime, int]:
    ms = _U_q(buf, off)[0]
    try:  # positional milliseconds: a keyword call costs a third more, per timestamp
        return _EPOCH + _TIMEDELTA(0, 0, 0, ms), off + 8
    except OverflowError:
        raise DecodeError(f"timestamp {ms} ms is outside the datetime range") from None


# The 8-bit forms are the common ones: decoded inline. The 32-bit forms share one helper.
def _d_vbin8(buf: Buffer, off: int, depth: int) -> tuple[bytes, int]:
    end = off + 1 + buf[off]
    if end > len(buf):
        raise overrun(buf, end)
    return bytes(buf[off + 1 : end]), end


def _d_str8(buf: Buffer, off: int, depth: int) -> tuple[str, int]:
    end = off + 1 + buf[off]
    if end > len(buf):
        raise overrun(buf, end)
    return str(buf[off + 1 : end], "utf-8"), end


def _d_sym8(buf: Buffer, off: int, depth: int) -> tuple[Symbol, int]:
    end = off + 1 + buf[off]
    if end > len(buf):
        raise overrun(buf, end)
    return Symbol(str(buf[off + 1 : end], "ascii")), end


def _var32(convert: Callable[[Buffer], object]) -> Decoder:
    def dec(buf: Buffer, off: int, depth: int) -> tuple[object, int]:
        end = off + 4 + _U_I(buf, off)[0]
        if end > len(buf):
            raise overrun(buf, end)
        return convert(buf[off + 4 : end]), end

    return dec


# Plain decoders per scalar type name (codes accepted for that type -> payload decoder);
# codec.py adds the compound types.
PLAIN_SCALARS: dict[str, dict[int, Decoder]] = {
    "null": {0x40: decode_null},
    "boolean": {0x56: _d_bool, 0x41: _const(True), 0x42: _const(False)},
    "ubyte": {0x50: _d_u8},
    "ushort": {0x60: _unpacker("H")},
    "uint": {0x70: _unpacker("I"), 0x52: _d_u8, 0x43: _d_zero},
    "ulong": {0x80: _unpacker("Q"), 0x53: _d_u8, 0x44: _d_zero},
    "byte": {0x51: _unpacker("b")},
    "short": {0x61: _unpacker("h")},
    "int": {0x71: _unpacker("i"), 0x54: _unpacker("b")},
    "long": {0x81: _unpacker("q"), 0x55: _unpacker("b")},
    "float": {0x72: _unpacker("f", Float32)},
    "double": {0x82: _unpacker("d")},
    "decimal32": {0x74: _fixed(Decimal32, 4)},
    "decimal64": {0x84: _fixed(Decimal64, 8)},
    "decimal128": {0x94: _fixed(Decimal128, 16)},
    "char": {0x73: _d_char},
    "timestamp": {0x83: _d_timestamp},
    "uuid": {0x98: _fixed(lambda b: uuid.UUID(bytes=b), 16)},
    "binary": {0xA0: _d_vbin8, 0xB0: _var32(bytes)},
    "string": {0xA1: _d_str8, 0xB1: _var32(lambda b: str(b, "utf-8"))},
    "symbol": {0xA3: _d_sym8, 0xB3: _var32(lambda b: Symbol(str(b, "ascii")))},
}
