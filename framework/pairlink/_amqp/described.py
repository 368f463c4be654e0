"""Described classes: the ``@composite``/``@restricted`` decorators and the descriptor registry.

The spec's frame bodies and message sections are described lists (composites) or described
single values (restricted types). Each is declared once, as a class of ``amqp_field``s under one
of these decorators, which makes it an attrs class, generates its straight-line encoder and
decoder (once, when decorated, so a frame costs no per-field interpretation) and registers both
under the class's descriptor code and symbolic name.

It is apart from codec.py because it is a different job: codec.py and scalars.py are the type
system (the per-type encoders and the constructor-byte decoder tables); this module compiles
class declarations on top of it. It builds from their public encoder and decoder functions and
tables (the three modules are one codec in three files) and registers each class with the codec
(``register_class``), which then encodes it by type and decodes it by descriptor. Neither
imports anything from here, so there is no cycle; a class decodes as itself once the module
declaring it (messaging.py, performatives.py) has been imported.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol, TypeVar, cast, dataclass_transform

import attrs

from pairlink._amqp.codec import (
    CLASS_DECODERS,
    DECODERS,
    ENCODERS,
    MAX_DEPTH,
    PLAIN_DECODERS,
    ClassDecoder,
    decode_descriptor,
    encode_array,
    encode_descriptor,
    encode_fields,
    encode_into,
    encode_list,
    encode_map,
    invalid_constructor,
    list_decoders,
    register_class,
    resolve_encoder,
    skip_values,
)
from pairlink._amqp.errors import INVALID_FIELD, DecodeError, LocalProtocolError
from pairlink._amqp.scalars import (
    UINT_SMALL,
    Decoder,
    Encoder,
    decode_null,
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
    encode_short,
    encode_string,
    encode_symbol,
    encode_timestamp,
    encode_ubyte,
    encode_uint,
    encode_ulong,
    encode_ushort,
    encode_uuid,
)
from pairlink._amqp.types import (
    FIELD_META,
    FIELD_TYPES,
    Array,
    Buffer,
    Byte,
    Char,
    Decoded,
    FieldSpec,
    Float32,
    Int,
    Long,
    Short,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
    field_type,
)

_T = TypeVar("_T")

_P_BII = struct.Struct(">BII").pack  # a list32 header: constructor, size, count
_U_II = struct.Struct(">II").unpack_from
_U_I = struct.Struct(">I").unpack_from
_U_Q = struct.Struct(">Q").unpack_from

_CLASSES: dict[int | str, type] = {}
"""Registered classes by ulong descriptor code and by symbolic name (see ``registered_class``)."""
_VALUE_DEC: dict[type, ClassDecoder] = {}
"""Value-only decoders of the ``@restricted`` classes (see ``value_decoder``)."""
_PROVIDERS: dict[str, set[int | str]] = {}
"""Descriptors (codes and names) of the classes that provide each spec type (``source``...),
and of each composite under its own type name (``error``): what a ``requires`` field takes."""


def encode_message_id(v: object, out: bytearray) -> None:
    """Message ids are ulong, uuid, binary or string: a plain int can only mean ulong."""
    if type(v) is int:
        encode_ulong(v, out)
    else:
        encode_into(v, out)


_FIELD_ENC: dict[str, Encoder] = {
    "boolean": encode_bool, "ubyte": encode_ubyte, "ushort": encode_ushort, "uint": encode_uint,
    "ulong": encode_ulong, "byte": encode_byte, "short": encode_short, "int": encode_int,
    "long": encode_long, "float": encode_float, "double": encode_double,
    "decimal32": encode_decimal32, "decimal64": encode_decimal64,
    "decimal128": encode_decimal128, "char": encode_char, "timestamp": encode_timestamp,
    "uuid": encode_uuid, "binary": encode_binary, "string": encode_string,
    "symbol": encode_symbol, "list": encode_list, "map": encode_map, "fields": encode_fields,
    "array": encode_array, "message-id": encode_message_id, "*": encode_into,
}  # fmt: skip
assert set(_FIELD_ENC) == FIELD_TYPES
# How an element of a ``multiple`` field is made into the value whose encoder fits the type.
_COERCE: dict[str, type] = {
    "boolean": bool, "ubyte": UByte, "ushort": UShort, "uint": UInt, "ulong": ULong,
    "byte": Byte, "short": Short, "int": Int, "long": Long, "float": Float32, "double": float,
    "char": Char, "binary": bytes, "string": str, "symbol": Symbol,
}  # fmt: skip


# The types a message-id may be (messaging.xml: message-id-ulong, -uuid, -binary, -string).
_MESSAGE_ID_TYPES = ("ulong", "uuid", "binary", "string")


def _field_table(t: str, requires: str | None = None) -> list[Decoder]:
    """The 256-entry decoder table of a typed field: its own codes, null, nothing else."""
    if requires is not None:
        return _requires_table(requires)
    if t == "*":
        return DECODERS
    table = [invalid_constructor(c, t) for c in range(256)]
    table[0x40] = decode_null
    if t == "message-id":  # wrapped as the generic decoders do: a ulong id stays a ulong
        for name in _MESSAGE_ID_TYPES:
            for code in PLAIN_DECODERS[name]:
                table[code] = DECODERS[code]
        return table
    plain = PLAIN_DECODERS["map" if t == "fields" else t]
    wrap = t == "array"
    for code, dec in plain.items():
        table[code] = DECODERS[code] if wrap else _fields_keys(dec) if t == "fields" else dec
    return table


def _fields_keys(dec: Decoder) -> Decoder:
    """A ``fields`` map (fields, annotations, filter-set): its keys are symbols (ulongs too in
    annotations). A string key is read as the symbol it should have been, so it must be ASCII:
    that way every key we accept encodes again."""

    def d(buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
        v, off = dec(buf, off, depth)
        for k in v:
            t = type(k)
            if t is not Symbol and t is not ULong and not (t is str and k.isascii()):
                raise DecodeError(f"a fields map key must be a symbol, not {t.__name__}")
        return v, off

    return d


def _requires_table(requires: str) -> list[Decoder]:
    """A field whose value must be a described type providing ``requires`` (or null)."""
    providers = _PROVIDERS.setdefault(requires, set())  # filled as classes register

    def dec(buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
        if depth >= MAX_DEPTH:
            raise DecodeError(f"nesting deeper than {MAX_DEPTH}")
        if buf[off] == 0x53:
            desc: int | Symbol = buf[off + 1]
            off += 2
        else:
            desc, off = decode_descriptor(buf, off, depth + 1)
        if desc not in providers:
            raise DecodeError("a described %.40r is not a %s" % (desc, requires))  # noqa: UP031
        return CLASS_DECODERS[desc](buf[off], buf, off + 1, depth + 1)

    table = [invalid_constructor(c, requires) for c in range(256)]
    table[0x40] = decode_null
    table[0x00] = dec
    return table


def _listed(dec: Decoder) -> Decoder:
    def d(buf: Buffer, off: int, depth: int) -> tuple[list[Decoded], int]:
        v, off = dec(buf, off, depth)
        return [v], off

    return d


def _multiple_table(t: str) -> list[Decoder]:
    """A ``multiple`` field: null, one value (yielded as a one-item list), an array of them,
    or a list of them, which some peers send (Qpid Proton 0.37 for capabilities given as a
    Python list) and which we read, liberal in what we accept. Each item must be of the
    field's type (a null item is refused too): anything else is a decode error."""
    single = _field_table(t)
    allowed = frozenset(PLAIN_DECODERS["map" if t == "fields" else t]) if t != "*" else None

    def checked(dec: Decoder) -> Decoder:
        def d(buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
            v, off = dec(buf, off, depth)
            if allowed is not None and v.element_code not in allowed:
                raise DecodeError(f"array of 0x{v.element_code:02x} in a multiple {t} field")
            return v, off

        return d

    items = list(single)
    items[0x40] = invalid_constructor(0x40, f"{t} list item")
    table = [_listed(d) for d in single]
    table[0x40] = decode_null
    for code, dec in PLAIN_DECODERS["array"].items():
        table[code] = checked(dec)
    for code, dec in list_decoders(items).items():
        table[code] = dec
    return table


def _multiple_enc(t: str) -> Encoder:
    single = _FIELD_ENC[t]
    coerce = _COERCE.get(t)
    empty = next(iter(PLAIN_DECODERS[t])) if t in PLAIN_DECODERS else 0x40

    def enc(v: object, out: bytearray) -> None:
        if isinstance(v, (list, tuple)):
            items = v if coerce is None else [coerce(x) for x in v]
            encode_array(
                Array(items, getattr(v, "element_code", None) or (None if v else empty)), out
            )
        else:
            single(v, out)

    return enc


def _prefix(code: int | str) -> bytes:
    out = bytearray(b"\x00")
    encode_descriptor(code, out)
    return bytes(out)


def _compile(src: str, ns: dict[str, object], fn: str) -> object:
    """The function ``fn`` that ``src`` defines, run in ``ns``; which is opaque to mypy, so
    the caller says what it built (once per class, when decorated)."""
    exec(compile(src, f"<amqp codec {fn}>", "exec"), ns)
    return ns[fn]


def _writer(i: int, s: FieldSpec) -> list[str]:
    """Source lines writing the non-null field ``v{i}``, inlined for the most common types."""
    v = f"v{i}"
    if s.multiple or s.amqp_type not in ("boolean", "uint", "*"):
        return [f"E{i}({v}, out)"]
    if s.amqp_type == "boolean":
        return [f"out.append(65 if {v} else 66)"]
    if s.amqp_type == "uint":
        return [f"if 0 <= {v} <= 255: out += UINT_SMALL[{v}]", f"else: E{i}({v}, out)"]
    return [f"(ENC.get(type({v})) or resolve(type({v})))({v}, out)"]


# Field encodings decoded inline by a composite's decoder, with no call: per constructor, the
# field types whose table decodes it to exactly this (plain, unwrapped) value, the expression
# building it from the data at ``off``, and the offset past it (``None``: a sized value, inlined
# only when it fits the data, ending at ``e``; one that does not goes to the table's decoder,
# which raises as ever).
_INLINE: dict[int, tuple[frozenset[str], str, str | None]] = {
    0xA1: (frozenset(("string", "message-id", "*")), "str(buf[off + 2:e], 'utf-8')", None),
    0xA3: (frozenset(("symbol", "*")), "Symbol(str(buf[off + 2:e], 'ascii'))", None),
    0xA0: (frozenset(("binary", "message-id", "*")), "bytes(buf[off + 2:e])", None),
    0x52: (frozenset(("uint",)), "buf[off + 1]", "off + 2"),
    0x53: (frozenset(("ulong",)), "buf[off + 1]", "off + 2"),
    0x70: (frozenset(("uint",)), "U_I(buf, off + 1)[0]", "off + 5"),
    0x80: (frozenset(("ulong",)), "U_Q(buf, off + 1)[0]", "off + 9"),
    0x43: (frozenset(("uint",)), "0", "off + 1"),
    0x44: (frozenset(("ulong",)), "0", "off + 1"),
    0x41: (frozenset(("boolean", "*")), "True", "off + 1"),
    0x42: (frozenset(("boolean", "*")), "False", "off + 1"),
}


def _reader(i: int, s: FieldSpec) -> list[str]:
    """Source lines decoding the non-null field ``v{i}`` at ``off`` (its constructor in ``c``):
    the common encodings of its type inline (``_INLINE``), any other through its table."""
    lines = []
    if not s.multiple and s.requires is None:
        for code, (types, value, end) in _INLINE.items():
            if s.amqp_type not in types:
                continue
            if end is None:
                cond = f"c == {code} and (e := off + 2 + buf[off + 1]) <= blen"
                lines.append(f"elif {cond}: v{i} = {value}; off = e")
            else:
                lines.append(f"elif c == {code}: v{i} = {value}; off = {end}")
    return [*lines, f"else: v{i}, off = T{i}[c](buf, off + 1, depth)"]


def _gen_composite(
    cls: type, name: str, pre: bytes, specs: list[tuple[str, FieldSpec]], provides: tuple[str, ...]
) -> None:
    """Generate straight-line encode/decode functions for one composite class.

    Both nest one ``if`` per field, so the work stops at the last field present: trailing
    nulls cost nothing to omit on the way out, nor absent fields on the way in.
    """
    k = len(specs)
    ns: dict[str, object] = {"head": pre + b"\xc0\x00\x00", "list0": pre + b"\x45",
                          "P_BII": _P_BII, "U_II": _U_II, "DecodeError": DecodeError, "CLS": cls,
                          "LocalProtocolError": LocalProtocolError, "INVALID": INVALID_FIELD,
                          "skip": skip_values, "UINT_SMALL": UINT_SMALL, "ENC": ENCODERS,
                          "resolve": resolve_encoder, "Symbol": Symbol,
                          "U_I": _U_I, "U_Q": _U_Q}  # fmt: skip
    enc = ["def enc(self, out):"]
    dec = [
        "def dec(code, buf, off, depth):",
        "    if code == 0xc0:",
        "        end = off + 1 + buf[off]; n = buf[off + 1]; off += 2",
        "    elif code == 0x45:",
        "        end = off; n = 0",
        "    elif code == 0xd0:",
        "        size, n = U_II(buf, off); end = off + 4 + size; off += 8",
        "    else:",
        f"        raise DecodeError('{name}: constructor 0x%02x is not a list' % code)",
        "    blen = len(buf)",
        "    if end > blen or n > end - off:",
        f"        raise DecodeError('{name}: list size or count exceeds the data')",
    ]
    post: list[str] = []
    body: list[str] = []
    indent = "    "
    for i, (attr, s) in enumerate(specs):
        ns[f"E{i}"] = _multiple_enc(s.amqp_type) if s.multiple else _FIELD_ENC[s.amqp_type]
        ns[f"T{i}"] = (
            _multiple_table(s.amqp_type) if s.multiple else _field_table(s.amqp_type, s.requires)
        )
        ns[f"D{i}"] = s.default
        ns[f"C{i}"] = s.choices
        enc.append(f"    v{i} = self.{attr}")
        if s.choices is not None:
            msg = f"'{name}: %.40r is not a {attr}' % (v{i},)"
            post.append(f"    if v{i} is not None and v{i} not in C{i}:")
            post.append(f"        raise DecodeError({msg}, INVALID)")
        if s.default is not None:
            enc.append(f"    if v{i} == D{i}: v{i} = None")
            post.append(f"    if v{i} is None: v{i} = D{i}")
        if s.mandatory:
            msg = f"'{name}: mandatory field {attr} is missing'"
            enc.append(f"    if v{i} is None: raise LocalProtocolError(INVALID, {msg})")
            post.append(f"    if v{i} is None: raise DecodeError({msg}, INVALID)")
            body += [indent + line for line in _writer(i, s)]
        else:
            body += [f"{indent}if v{i} is None: out.append(64)", f"{indent}else:"]
            body += [f"{indent}    {line}" for line in _writer(i, s)]
        dec += [
            f"{indent}if n > {i}:",
            f"{indent}    c = buf[off]",  # nulls are common: skip them without a call
            f"{indent}    if c == 64: off += 1",
            *(f"{indent}    {line}" for line in _reader(i, s)),
        ]
        indent += "    "
        if i < k - 1:
            body.append(f"{indent[:-4]}if n > {i + 1}:")
    dec.append(f"{indent}if n > {k}: off = skip(buf, off, n - {k}, depth)")
    if k:
        dec.insert(12, "    " + " = ".join(f"v{i}" for i in range(k)) + " = None")
        enc += [f"    {'el' if i < k - 1 else ''}if v{i} is not None: n = {i + 1}"
                for i in reversed(range(k))]  # fmt: skip
        enc += ["    else:", "        out += list0", "        return"]
        enc += ["    out += head", "    pos = len(out)", *body, "    size = len(out) - pos + 1"]
        enc += ["    if size <= 255:", "        out[pos - 2] = size; out[pos - 1] = n", "    else:"]
        enc += ["        out[pos - 3:pos] = P_BII(0xd0, size + 3, n)"]
    else:
        enc.append("    out += list0")
    dec += [
        "    if off != end:",
        f"        raise DecodeError('{name}: list size disagrees with its fields')",
    ]
    dec += post
    dec.append(f"    return CLS({', '.join(f'v{i}' for i in range(k))}), off")
    enc_fn = cast(Encoder, _compile("\n".join(enc), ns, "enc"))
    dec_fn = cast(ClassDecoder, _compile("\n".join(dec), ns, "dec"))
    _register(cls, enc_fn, dec_fn, provides, k)


def _register(
    cls: type, enc: Encoder, dec: ClassDecoder, provides: tuple[str, ...], weight: int
) -> None:
    code, name = cls.__amqp_descriptor__  # type: ignore[attr-defined]
    for key in (code, name):  # check both before registering either
        old = _CLASSES.get(key)
        if old is not None and old.__qualname__ != cls.__qualname__:  # (a reload is no clash)
            raise ValueError(f"descriptor {key!r} already belongs to {old.__qualname__}")
    for key in (code, name):
        _CLASSES[key] = cls
    register_class(cls, (code, name), enc, dec, weight)
    cls.__amqp_provides__ = provides  # type: ignore[attr-defined]
    own = name.split(":")[1] if name.count(":") == 2 else name  # "amqp:error:list" -> "error"
    for provided in (*provides, own):
        _PROVIDERS.setdefault(provided, set()).update((code, name))


def _describe(cls: type, code: int, name: str) -> tuple[bytes, type]:
    if not 0 <= code <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"descriptor code out of ulong range: {code}")
    name.encode("ascii")
    new_cls = attrs.define(cls, slots=True)
    new_cls.__amqp_descriptor__ = (code, Symbol(name))  # type: ignore[attr-defined]
    return _prefix(code), new_cls


@dataclass_transform()
def composite(
    *, code: int, name: str, provides: tuple[str, ...] = ()
) -> Callable[[type[_T]], type[_T]]:
    """Make an ``amqp_field``-annotated class an attrs class encoded as a described list.

    ``code`` is the full ulong descriptor (spec ``0x00000000:0x000000XX`` is ``0xXX``);
    ``provides``: the spec types it may stand for (``source``, ``outcome``...), as in the XML.
    """

    def decorate(cls: type[_T]) -> type[_T]:
        pre, new_cls = _describe(cls, code, name)
        specs = []
        for f in attrs.fields(new_cls):
            spec = f.metadata.get(FIELD_META)
            if spec is None:
                raise TypeError(f"{cls.__qualname__}.{f.name} is not declared with amqp_field")
            specs.append((f.name, spec))
        new_cls.__amqp_fields__ = tuple(specs)  # type: ignore[attr-defined]
        _gen_composite(new_cls, name, pre, specs, provides)
        return new_cls

    return decorate


class _HasValue(Protocol):
    """An instance of a ``@restricted`` class, as its encoder reads it."""

    @property
    def value(self) -> object: ...


@dataclass_transform()
def restricted(
    *, code: int, name: str, source: str, provides: tuple[str, ...] = ()
) -> Callable[[type[_T]], type[_T]]:
    """Make a class with one attribute ``value`` a described value of the ``source`` type."""
    base = field_type(source)

    def decorate(cls: type[_T]) -> type[_T]:
        pre, new_cls = _describe(cls, code, name)
        if [f.name for f in attrs.fields(new_cls)] != ["value"]:
            raise TypeError(f"{cls.__qualname__} must have exactly one attribute, 'value'")
        value_enc = _FIELD_ENC[base]
        table = _field_table(base)

        def enc(self: _HasValue, out: bytearray) -> None:
            out += pre
            v = self.value
            if v is None:
                out.append(0x40)
            else:
                value_enc(v, out)

        def value_dec(code: int, buf: Buffer, off: int, depth: int) -> tuple[Decoded, int]:
            return table[code](buf, off, depth)

        def dec(code: int, buf: Buffer, off: int, depth: int) -> tuple[object, int]:
            v, off = table[code](buf, off, depth)
            return new_cls(v), off

        _register(new_cls, enc, dec, provides, 1)
        _VALUE_DEC[new_cls] = value_dec
        return new_cls

    return decorate


def class_decoder(cls: type) -> ClassDecoder:
    """The decoder registered for a described class (format code, buffer, offset, depth)."""
    return CLASS_DECODERS[cls.__amqp_descriptor__[0]]  # type: ignore[attr-defined]


def value_decoder(cls: type) -> ClassDecoder:
    """The decoder of a ``@restricted`` class's value alone, without the instance around it.

    For a caller that only wants the value (``Message.decode`` keeps a data section's bytes,
    not a ``Data``): same checks and errors as the class decoder, one object fewer.
    """
    return _VALUE_DEC[cls]


def registered_class(descriptor: int | str) -> type | None:
    """The class registered for a descriptor code or symbolic name, if any."""
    return _CLASSES.get(descriptor)
