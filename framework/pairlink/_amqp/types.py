"""Python values for the AMQP 1.0 type system (types.xml) that have no exact built-in twin.

AMQP distinguishes widths and signedness that Python's ``int``/``float``/``str`` erase, so a value
that must travel as, say, a ``uint`` or a ``symbol`` is wrapped in a thin subclass: it still *is*
an ``int``/``str`` for the application, but the codec can pick the right wire type, and decoding
gives the same wrapper back so a value survives a round trip unchanged. Plain ``int`` goes out as
``long``, ``float`` as ``double``, ``str`` as ``string``.

The declarations of composite fields (``amqp_field``, ``FieldSpec``) live here too, so that a
class can be declared without the codec; described.py compiles them into encoders and decoders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

import attrs

if TYPE_CHECKING:
    from _typeshed import ConvertibleToInt

__all__ = [
    "Array",
    "Buffer",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Decoded",
    "Described",
    "FieldSpec",
    "Fields",
    "Float32",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "amqp_field",
]

_T = TypeVar("_T")

Decoded: TypeAlias = Any
"""A value the codec decoded from the peer's bytes: of whatever type the peer sent, which the
caller checks before relying on it (by ``type()``, ``isinstance`` or a field's declared type,
which the decoder enforced). ``Any`` on purpose, and the only ``Any`` of the decode side: the
exact union would be open (every described class registered at import belongs to it) and
recursive, and ``object`` would make every caller cast what it has just checked by means mypy
cannot follow (a descriptor table, ``type(v) is X`` kept in a local), costing calls on paths
that run per value."""

Buffer: TypeAlias = bytes | bytearray | memoryview
"""What the decoders read: indexing gives an ``int``, slicing the same kind of buffer, and
``struct`` unpacks from it (frames come as ``bytearray``/``memoryview``, messages as ``bytes``)."""


class Symbol(str):
    """An AMQP ``symbol``: an ASCII name (capabilities, annotation keys, error conditions)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    """An AMQP ``char``: exactly one Unicode code point, sent as UTF-32."""

    __slots__ = ()

    def __new__(cls, value: str) -> Char:
        if len(value) != 1 or 0xD800 <= ord(value) <= 0xDFFF:
            raise ValueError(f"Char needs one non-surrogate code point, got {value!r}")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str.__repr__(self)})"


class _RangedInt(int):
    """Base of the fixed-width integer wrappers: the range is checked once, when built."""

    __slots__ = ()
    _min = 0
    _max = 0

    def __new__(cls, value: ConvertibleToInt = 0) -> Self:
        self = super().__new__(cls, value)
        if not cls._min <= self <= cls._max:
            raise OverflowError(f"{cls.__name__} out of range [{cls._min}, {cls._max}]: {value}")
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    def __str__(self) -> str:  # int's str() would use the repr above: "UInt(5)" in messages
        return int.__repr__(self)


class UByte(_RangedInt):
    """AMQP ``ubyte`` (0..255)."""

    __slots__ = ()
    _min, _max = 0, 0xFF


class UShort(_RangedInt):
    """AMQP ``ushort`` (0..65535)."""

    __slots__ = ()
    _min, _max = 0, 0xFFFF


class UInt(_RangedInt):
    """AMQP ``uint`` (0..2**32-1)."""

    __slots__ = ()
    _min, _max = 0, 0xFFFFFFFF


class ULong(_RangedInt):
    """AMQP ``ulong`` (0..2**64-1)."""

    __slots__ = ()
    _min, _max = 0, 0xFFFFFFFFFFFFFFFF


class Byte(_RangedInt):
    """AMQP ``byte`` (signed 8 bit)."""

    __slots__ = ()
    _min, _max = -0x80, 0x7F


class Short(_RangedInt):
    """AMQP ``short`` (signed 16 bit)."""

    __slots__ = ()
    _min, _max = -0x8000, 0x7FFF


class Int(_RangedInt):
    """AMQP ``int`` (signed 32 bit)."""

    __slots__ = ()
    _min, _max = -0x80000000, 0x7FFFFFFF


class Long(_RangedInt):
    """AMQP ``long`` (signed 64 bit); plain ``int`` encodes the same way."""

    __slots__ = ()
    _min, _max = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Float32(float):
    """AMQP ``float`` (IEEE 754 binary32); plain ``float`` goes out as ``double``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float32({float(self)!r})"


def _width(n: int) -> Callable[[object, object, bytes], None]:
    def check(_inst: object, _attr: object, raw: bytes) -> None:
        if type(raw) is not bytes or len(raw) != n:
            raise ValueError(f"needs exactly {n} raw bytes, got {raw!r}")

    return check


@attrs.frozen
class Decimal32:
    """AMQP ``decimal32``, kept as its exact IEEE 754 bytes: nothing here does decimal maths."""

    raw: bytes = attrs.field(validator=_width(4))


@attrs.frozen
class Decimal64:
    """AMQP ``decimal64`` as exact bytes (see ``Decimal32``)."""

    raw: bytes = attrs.field(validator=_width(8))


@attrs.frozen
class Decimal128:
    """AMQP ``decimal128`` as exact bytes (see ``Decimal32``)."""

    raw: bytes = attrs.field(validator=_width(16))


class Array(list[_T]):
    """An AMQP ``array``: one element type for all items, written once.

    ``element_code`` is the constructor byte shared by the elements (for described elements,
    the code of the inner value); ``None`` lets the encoder choose the narrowest one that fits
    every element. Decoding always sets it to the code found on the wire.
    """

    __slots__ = ("element_code",)

    def __init__(self, items: Iterable[_T] = (), element_code: int | None = None) -> None:
        super().__init__(items)
        self.element_code = element_code

    def __repr__(self) -> str:
        code = "None" if self.element_code is None else hex(self.element_code)
        return f"Array({list.__repr__(self)}, element_code={code})"


@attrs.frozen
class Described:
    """A described value whose descriptor has no registered class.

    ``descriptor`` is an ``int`` (a ulong code, domain in the high 32 bits) or a ``Symbol``
    (a plain ``str`` goes out as one too); ``value`` is only encoded or compared.
    """

    descriptor: int | str
    value: object


Fields: TypeAlias = dict[Symbol, Decoded]
"""An AMQP ``fields`` map (the properties of open, begin, attach and flow): symbol keys (a
plain ``str`` key goes out as one), values of any type, which in a received frame are whatever
the peer sent (``Decoded``)."""

# ----------------------------------------------------------------- composite field declarations
# They live here, beside the values, so that declaring a class needs nothing from the codec;
# described.py turns the declarations into encoders and decoders.

FIELD_TYPES = frozenset(
    ("boolean", "ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "float",
     "double", "decimal32", "decimal64", "decimal128", "char", "timestamp", "uuid", "binary",
     "string", "symbol", "list", "map", "array", "fields", "message-id", "*")
)  # fmt: skip
"""Field types the codec knows: the primitives, ``fields`` (a map whose ``str`` keys go out as
symbols), ``message-id`` (like ``*``, but a plain ``int`` goes out as the ulong the spec allows
there, not as a long) and ``*`` (any value, its type chosen by its Python type)."""

# Restricted spec types that fields may name directly, and what they are on the wire. The only
# ``address`` the spec defines is ``address-string``, so an address is a string.
_ALIASES = {
    **dict.fromkeys(("milliseconds", "seconds", "handle", "sequence-no", "delivery-number",
                     "transfer-number", "message-format", "terminus-durability"), "uint"),
    **dict.fromkeys(("sender-settle-mode", "receiver-settle-mode", "sasl-code"), "ubyte"),
    **dict.fromkeys(("ietf-language-tag", "terminus-expiry-policy"), "symbol"),
    **dict.fromkeys(("annotations", "filter-set", "node-properties"), "fields"),
    **dict.fromkeys(("error", "delivery-state", "outcome", "source", "target"), "*"),
    "role": "boolean", "delivery-tag": "binary", "address": "string",
}  # fmt: skip
REQUIRES = frozenset(_k for _k, _v in _ALIASES.items() if _v == "*")
"""Spec types a field names whose values are described types that ``provide`` them (or, for
``error``, the composite of that name): anything else there is a decode error, whatever it is."""
_CHOICES: dict[str, frozenset[int | str]] = {
    "sender-settle-mode": frozenset((0, 1, 2)),
    "receiver-settle-mode": frozenset((0, 1)),
    "terminus-durability": frozenset((0, 1, 2)),
    "terminus-expiry-policy": frozenset(
        ("link-detach", "session-end", "connection-close", "never")
    ),
    "sasl-code": frozenset((0, 1, 2, 3, 4)),
}
"""The values a restricted type with ``<choice>``s allows (another value is an invalid field)."""
FIELD_META = "pairlink.amqp"
"""Key of the ``FieldSpec`` in an attrs field's metadata."""


def field_type(name: str) -> str:
    """The codec's type for a spec type name (``handle`` -> ``uint``); unknown names fail early."""
    base = _ALIASES.get(name, name)
    if base not in FIELD_TYPES:
        raise ValueError(f"unknown AMQP field type {name!r}")
    return base


@attrs.frozen
class FieldSpec:
    """One field of a composite: its AMQP type (aliases resolved) and its spec flags.

    ``requires``: the spec type its described value must provide (``source``...), if any;
    ``choices``: the values its restricted type allows, if it lists them. Both are checked when
    the field is decoded, so a value that reaches the engine is one the spec allows there.
    """

    amqp_type: str
    mandatory: bool = False
    multiple: bool = False
    default: object = None
    requires: str | None = None
    choices: frozenset[int | str] | None = None


def amqp_field(
    amqp_type: str, *, mandatory: bool = False, multiple: bool = False, default: object = None
) -> Any:
    """Declare a composite field: an attrs field (default ``default``) carrying its AMQP type.

    Mandatory fields default to ``None`` too (attrs forbids required fields after optional
    ones, and the spec interleaves them); leaving one unset fails at encode time. Returns
    ``Any`` as ``attrs.field`` does, so that it fits whatever type the class annotates.
    """
    spec = FieldSpec(
        field_type(amqp_type),
        mandatory,
        multiple,
        default,
        amqp_type if amqp_type in REQUIRES else None,
        _CHOICES.get(amqp_type),
    )
    return attrs.field(default=default, metadata={FIELD_META: spec})
