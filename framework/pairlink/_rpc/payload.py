"""Message bodies by content type: how call arguments and results become bytes and back.

A request's body may come from our client (the pairlink envelope: positional and keyword
arguments apart, sent only to a pairlink peer), from any msgpack or JSON speaker, as raw bytes,
or as an AMQP value (what a Proton client sends, and our client sends any other peer).
:func:`arguments_value` (the client's half) and :func:`split_arguments` (the service's) are one
convention, read back as written. AMQP values come out plain (:func:`plain`). The reply answers
in the request's own encoding, so every caller can read it. Between pairlink peers msgpack is
the codec: compact, fast, and it keeps bytes apart from strings.

Decoding a body is bounded like decoding an AMQP message: at most ``max_elements`` values
(codec.py's ``MAX_ELEMENTS`` by default), so a body of tiny values (8 MiB of empty msgpack
arrays became 519 MiB) is refused with a ``PayloadError`` instead of held.
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Sized
from typing import TypeVar

import msgpack

from pairlink._amqp.codec import MAX_ELEMENTS
from pairlink._amqp.messaging import BodyKind, Message, Properties
from pairlink._amqp.types import Decoded, Symbol
from pairlink.errors import PayloadError

MSGPACK = "application/msgpack"
JSON = "application/json"
OCTETS = "application/octet-stream"
ENVELOPE = "application/x-pairlink-call+msgpack"
"""Our client's request body: msgpack ``[args, kwargs]``, unambiguous whatever the arguments."""
BATCH = "application/x-pairlink-batch+msgpack"
"""A batch request's body: a msgpack array of rows, each an envelope ``[args, kwargs]``: one
message for many calls of one operation (:mod:`pairlink._rpc.batch`)."""


class Encoding(enum.Enum):
    ENVELOPE = ENVELOPE
    BATCH = BATCH
    MSGPACK = MSGPACK
    JSON = JSON
    RAW = OCTETS
    AMQP_VALUE = "amqp-value"

    # Members are singletons compared by identity: hashing them by identity too, in C, keeps a
    # dict lookup by encoding (a content-type per call) off ``Enum.__hash__``, a Python call.
    __hash__ = object.__hash__


_BY_CONTENT_TYPE = {e.value: e for e in Encoding}
"""One dict lookup per message; iterating the Enum instead showed up in the server's profile."""


_packers = threading.local()
"""Each thread's ``msgpack.Packer``: ``packb`` builds one per call, which cost more than the
packing of a call's usual value. A packer empties its buffer after a value and after a failure,
so one per thread (an event loop's, each handler thread's) packs every value; but the buffer
keeps its room (``PACKER_KEPT_UP_TO``)."""

PACKER_KEPT_UP_TO = 1 << 20
"""A packer's buffer keeps the room of the largest value it packed, twice that value's size:
one 60 MiB result left its thread 120 MiB for good. A thread's packer that packed a larger
value (or failed, however far it got) is dropped with its buffer, the next value taking a new
one; up to this size it is kept, its room (2 MiB at most) costing less than a packer a value."""


def msgpack_dumps(value: object) -> bytes:
    """``value`` as msgpack (``PayloadError`` for what msgpack cannot hold)."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        data: bytes = packer.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        del _packers.packer
        raise PayloadError(f"cannot encode {type(value).__name__} as msgpack: {exc}") from exc
    if len(data) > PACKER_KEPT_UP_TO:
        del _packers.packer
    return data


def _too_many(max_elements: int) -> PayloadError:
    return PayloadError(f"body holds more than {max_elements} values")


_Container = TypeVar("_Container", bound=Sized)


VIEW_FROM = 1 << 14
"""From this many bytes on, :func:`msgpack_loads` reads a body that ends a message (``start``)
through a view of the message rather than a slice of it: a slice copies, and a large result's
body is most of its message (a 60 MiB reply was held three times over: message, body, value).
Below it the copy costs less than making the view (about 90 ns more; they meet near 16 KiB)."""


def msgpack_loads(data: bytes | memoryview, max_elements: int, start: int = 0) -> Decoded:
    """The msgpack value of ``data`` from ``start`` on: a message's last section, read in place
    rather than sliced when it is ``VIEW_FROM`` bytes or more.

    Every msgpack value takes a byte, so a body no longer than ``max_elements`` cannot hold
    more: it decodes as is. A longer one counts the items of each array and map as they are
    built (each container no larger than the bound, so none is built past it)."""
    if start:
        data = data[start:] if len(data) - start < VIEW_FROM else memoryview(data)[start:]
    counted = len(data) > max_elements
    try:
        if not counted:  # (the usual body; no keyword dict to unpack: it doubles the call)
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        left = [max_elements]

        def count(container: _Container) -> _Container:
            left[0] -= len(container) * (2 if type(container) is dict else 1)
            if left[0] < 0:
                raise _too_many(max_elements)
            return container

        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            list_hook=count,
            object_hook=count,
            max_array_len=max_elements,
            max_map_len=max_elements // 2,
        )
    except PayloadError:
        raise
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        if counted and "exceeds max_" in str(exc):  # one container over the bound on its own
            raise _too_many(max_elements) from exc
        raise PayloadError(f"body is not msgpack: {exc}") from exc


def _json_loads(data: bytes, max_elements: int) -> Decoded:
    """JSON values after the first each follow a comma or an opening bracket: counting those
    bytes (at memchr speed, strings included, so it errs on the safe side) bounds the values."""
    if len(data) > max_elements:
        marks = data.count(b",") + data.count(b"[") + data.count(b"{")
        if marks >= max_elements:
            raise _too_many(max_elements)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (nesting: RecursionError)
        raise PayloadError(f"body is not JSON: {exc}") from exc


def encoding_of(message: Message) -> Encoding:
    """Which encoding a message's body is in, from its body kind and content-type."""
    if message.body_kind == "value":
        return Encoding.AMQP_VALUE
    content_type = message.properties.content_type if message.properties else None
    if content_type is None:
        return Encoding.RAW if message.body_kind == "data" else Encoding.AMQP_VALUE
    encoding = _BY_CONTENT_TYPE.get(content_type)
    if encoding is not None:
        return encoding
    if str(content_type).startswith("application/json") or str(content_type).endswith("+json"):
        return Encoding.JSON
    return Encoding.RAW


def _data_bytes(message: Message) -> bytes:
    body = message.body
    if message.body_kind == "data":
        return b"".join(body) if isinstance(body, list) else bytes(body)
    raise PayloadError(f"expected a data body, got {message.body_kind}")


_MSGPACK_BODIES = frozenset((Encoding.MSGPACK, Encoding.ENVELOPE, Encoding.BATCH))


def decode_value(message: Message, max_elements: int = MAX_ELEMENTS) -> tuple[Decoded, Encoding]:
    """The value a message's body carries, and the encoding it came in; ``PayloadError`` for a
    body that is not what it claims or holds more than ``max_elements`` values. An AMQP body
    comes back as plain Python values (:func:`plain`)."""
    encoding = encoding_of(message)
    if encoding is Encoding.AMQP_VALUE:
        if message.body_kind == "sequence":
            return [plain(item) for section in message.body for item in section], encoding
        return plain(message.body), encoding
    data = _data_bytes(message)
    if encoding in _MSGPACK_BODIES:
        return msgpack_loads(data, max_elements), encoding
    if encoding is Encoding.JSON:
        return _json_loads(data, max_elements), encoding
    return data, encoding


_AS_IS = frozenset((int, float, str, bytes, bool, type(None)))


def plain(value: Decoded) -> Decoded:
    """``value`` as the plain Python value the AMQP wrappers stand for: every integer width an
    ``int``, ``float`` a ``float``, symbols and chars ``str``, arrays and lists ``list``, maps
    ``dict`` (keys too). What a caller or handler gets from another stack (rhea answers
    ``add(1, 2)`` with a uint) then looks as it would from pairlink. Timestamps, UUIDs,
    decimals and described values of no known class have no plainer form and stay as they are.
    The decoder bounds the depth, so the recursion is bounded too."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if isinstance(value, list):  # Array too
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def split_arguments(value: Decoded, encoding: Encoding) -> tuple[list[Decoded], dict[str, Decoded]]:
    """Call arguments from a request value: a list is positional arguments, a map keyword
    arguments, anything else one positional argument; our envelope says both apart. A batch's
    arguments are its rows, each an envelope (``[args, kwargs]``) as it came: a malformed row
    fails alone when it runs (:mod:`pairlink._server.batches`)."""
    if encoding is Encoding.BATCH:
        if not isinstance(value, list):
            raise PayloadError("a pairlink batch is an array of rows")
        return value, {}
    if encoding is Encoding.ENVELOPE:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not isinstance(value[0], list)
            or not isinstance(value[1], dict)
        ):
            raise PayloadError("a pairlink envelope is [args, kwargs]")
        args, kwargs = value
    elif isinstance(value, list):
        args, kwargs = value, {}
    elif isinstance(value, dict):
        args, kwargs = [], value
    elif encoding is Encoding.AMQP_VALUE and value is None:
        args, kwargs = [], {}
    else:
        args, kwargs = [value], {}
    if not kwargs:  # the usual call: positional arguments only
        return list(args), {}
    if not all(isinstance(k, str) for k in kwargs):
        raise PayloadError("keyword argument names must be strings")
    return list(args), {str(k): v for k, v in kwargs.items()}


def arguments_value(
    args: tuple[object, ...] | list[object], kwargs: dict[str, object], encoding: Encoding
) -> object:
    """The request value that carries ``args`` and ``kwargs`` in ``encoding``: what
    :func:`split_arguments` reads back as the same arguments.

    Our envelope is ``[args, kwargs]``. Any other body is what a server of another stack
    expects: keywords as a map; one positional argument as the bare value; none as null (an
    empty list for msgpack and JSON, whose null would be one argument); several as a list. A
    single argument that is itself a list, map or null goes in a list of one, as the reader
    would take it for the arguments themselves. Positional and keyword arguments together have
    no such form: ``PayloadError`` (a pairlink service reads both from the envelope). A
    batch's one argument is its body, packed already (:class:`pairlink._rpc.batch.Rows`)."""
    if encoding is Encoding.BATCH:
        (body,) = args
        return body
    if encoding is Encoding.ENVELOPE:
        return [list(args), kwargs]
    if kwargs:
        if args:
            raise PayloadError(
                f"a {encoding.name} body carries positional or keyword arguments, not both "
                "(only the pairlink envelope carries both)"
            )
        return kwargs
    if len(args) == 1:
        (value,) = args
        if value is not None and not isinstance(value, list | tuple | dict):
            return value
    elif not args and encoding is Encoding.AMQP_VALUE:
        return None
    return list(args)


_CONTENT_TYPES = {e: Symbol(e.value) for e in Encoding}


def set_body(message: Message, value: object, encoding: Encoding) -> None:
    """Put ``value`` in ``message`` in ``encoding``, with the matching content-type."""
    message.body, message.body_kind, content_type = encoded_body(value, encoding)
    if content_type is not None:
        if message.properties is None:
            message.properties = Properties()
        message.properties.content_type = content_type


def encoded_body(value: object, encoding: Encoding) -> tuple[object, BodyKind, Symbol | None]:
    """What ``value`` becomes in ``encoding``: the body, its kind and its content-type (none
    for an amqp-value)."""
    if encoding is Encoding.AMQP_VALUE:
        return value, "value", None
    if encoding is Encoding.JSON:
        try:
            data = json.dumps(value, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"cannot encode {type(value).__name__} as JSON: {exc}") from exc
    elif encoding is Encoding.RAW or encoding is Encoding.BATCH:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise PayloadError(f"a raw body must be bytes, not {type(value).__name__}")
        data = bytes(value)
    else:
        data = msgpack_dumps(value)
    return data, "data", _CONTENT_TYPES[encoding]


def reply_encoding(request_encoding: Encoding) -> Encoding:
    """Replies use the request's encoding; an envelope or batch request gets a plain msgpack
    value (a batch's: its rows' results)."""
    if request_encoding is Encoding.ENVELOPE or request_encoding is Encoding.BATCH:
        return Encoding.MSGPACK
    return request_encoding
