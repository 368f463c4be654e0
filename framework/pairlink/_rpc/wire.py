"""The wire conventions of a call (DESIGN.md "Wire conventions"), as pure functions.

A request carries its operation in ``application-properties["operation"]`` (the AMQP management
convention; ``subject`` is accepted too), a unique ``message-id``, the same value as its
``correlation-id`` (servers that copy the request's correlation-id into the reply, as Qpid
Proton's examples do, answer it as well as those that copy its message-id), ``reply-to``
(``$me`` on a paired link) and its deadline as ``header.ttl`` plus
``properties.absolute-expiry-time``. A reply carries ``correlation-id`` = the request's
message-id, else (a request with none, as Proton's ``SyncRequestResponse`` sends) its
correlation-id, and an HTTP-like ``status-code`` (an AMQP ``int``, as the management convention has
it; any integer type is read) and ``status-description``. Clock values come in as arguments, so
both sides and the tests share one definition without a clock.

The body of a request (:func:`pairlink._rpc.payload.arguments_value`) is pairlink's msgpack
envelope only for a peer whose open offers ``CALL_ENVELOPE`` (a pairlink container or gateway);
any other peer gets an ``amqp-value`` it can read (:func:`peer_encoding`).
"""

from __future__ import annotations

import datetime
import functools
import struct
from collections.abc import Mapping
from typing import Any

import attrs

from pairlink._amqp import errors as conditions
from pairlink._amqp.call_layout import (
    address_fields,
    binary_to_end,
    read_reply_properties,
    read_usual_request,
    usual_request_parts,
    write_reply_properties,
    write_request_properties,
    write_usual_request,
)
from pairlink._amqp.codec import MAX_ELEMENTS, decode_from, encode, encode_into
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.fast_paths import register
from pairlink._amqp.messaging import (
    Accepted,
    ApplicationProperties,
    BodyKind,
    Header,
    Message,
    MessageId,
    Properties,
    Rejected,
    encode_body,
)
from pairlink._amqp.types import Decoded, Int, Symbol
from pairlink._rpc.payload import (
    BATCH,
    ENVELOPE,
    Encoding,
    arguments_value,
    decode_value,
    encoded_body,
    msgpack_loads,
    plain,
    reply_encoding,
    set_body,
    split_arguments,
)
from pairlink.errors import CallError, PayloadError, RemoteError, RemoteTimeoutError

ME = "$me"
OPERATION = "operation"
STATUS_CODE = "status-code"
STATUS_DESCRIPTION = "status-description"
ERROR_TYPE = "error-type"
ERROR_REF = "error-ref"
"""The reference id under which a service logged an unexpected failure (a 500 whose details
it keeps to itself): the caller's handle for finding the traceback in the service's log."""

OK = 200
BAD_REQUEST = 400
NOT_FOUND = 404
TIMEOUT = 408
CONFLICT = 409
INTERNAL_ERROR = 500
UNAVAILABLE = 503
SHUTTING_DOWN = "shutting down"
"""The description of a 503 for a call its service did not run because it stops (it came
after the drain began, or still waited when the grace ran out): another replica may take it."""
SERVER_SHUTTING_DOWN = "the server is shutting down"
"""The description of the ``detach-forced`` that ends a stopping server's links, once it has
answered every call it held: a call still unanswered then was not run."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)

CALL_ENVELOPE = Symbol("pairlink:call-envelope")
"""The connection capability a pairlink container (and a gateway, which carries calls to
them) offers: it reads the msgpack call envelope, so a client may send it."""


def peer_encoding(offered_capabilities: list[str]) -> Encoding:
    """The request body a client sends a peer by default: our envelope to a peer that offers
    ``CALL_ENVELOPE``, an ``amqp-value`` that any AMQP stack reads to any other."""
    if CALL_ENVELOPE in offered_capabilities:
        return Encoding.ENVELOPE
    return Encoding.AMQP_VALUE


@attrs.define
class Request:
    """A decoded request, ready to dispatch."""

    operation: str
    args: list[Any]
    kwargs: dict[str, Any]
    message_id: MessageId | None
    reply_to: str | None
    encoding: Encoding
    deadline: float | None  # wall-clock seconds since the epoch, None: no deadline
    source: Message | bytes
    """The request's message; or, for one :func:`read_request` read without building it, its
    bytes, decoded the first time anything asks for the message."""
    correlation_id: MessageId | None = None
    """Its correlation-id, read only when it has no message-id (the usual request has one)."""

    @property
    def reply_correlation(self) -> MessageId | None:
        """The correlation-id of its reply: its message-id, else its own correlation-id."""
        message_id = self.message_id
        return self.correlation_id if message_id is None else message_id

    @property
    def message(self) -> Message:
        """The request as a message (decoded now if it was read without one)."""
        source = self.source
        if isinstance(source, bytes):
            source = self.source = Message.decode(source)
        return source

    @property
    def application_properties(self) -> dict[Decoded, Decoded]:
        """Its application-properties (for one read without its message, the operation's
        alone: the only ones :func:`read_request` takes)."""
        if isinstance(self.source, bytes):
            return {OPERATION: self.operation}
        return self.source.application_properties or {}


def request_message(
    operation: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    *,
    message_id: MessageId | None,
    now: float,
    timeout: float | None = None,
    reply_to: str | None = ME,
    encoding: Encoding = Encoding.ENVELOPE,
) -> Message:
    """A request for ``operation``; ``timeout`` seconds from ``now`` become its deadline."""
    header, properties = _request_head(message_id, now, timeout, reply_to)
    message = Message(
        header=header,
        properties=properties,
        application_properties={OPERATION: operation},
    )
    set_body(message, arguments_value(args, kwargs, encoding), encoding)
    return message


def encode_request(
    operation: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    *,
    message_id: MessageId | None,
    now: float,
    timeout: float | None = None,
    reply_to: str | None = ME,
    encoding: Encoding = Encoding.ENVELOPE,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The bytes of ``request_message(...)`` (same arguments), written without building the
    message: what the client sends for every call, so its constant parts (the header of a
    given ttl, the application-properties of an operation name, the descriptor and the
    null fields of the properties) are bytes encoded once each, and the message-id, encoded
    once, is copied as the correlation-id. ``headers``: application-properties beside the
    operation (a trace context)."""
    body, kind, content_type = encoded_body(arguments_value(args, kwargs, encoding), encoding)
    if timeout is not None and type(message_id) is int and 0xFF < message_id <= _ULONG_MAX:
        # the usual request (a counter's id past the first 255: the same size for them all):
        # the id twice and the expiry between bytes made once per (ttl, reply-to, encoding)
        ttl = _ttl_ms(timeout)  # (in the order the message's encoding fails, if it fails)
        expiry_ms = _expiry_ms(now, timeout)
        parts = _usual_parts(ttl, reply_to, encoding)
        out = write_usual_request(parts, message_id, expiry_ms)
        return _request_rest(out, operation, headers, body, kind)
    out = bytearray()
    expiry: int | None = None
    if timeout is not None:  # (in the order the message's encoding fails, if it fails)
        ttl = _ttl_ms(timeout)
        expiry = _expiry_ms(now, timeout)
        out += _header_section(ttl)
    if message_id is None:  # (no caller sends none; the generic encoder drops trailing nulls)
        properties = Properties(reply_to=reply_to, content_type=content_type)
        if timeout is not None:
            properties.absolute_expiry_time = deadline_fields(now, timeout)[1]
        encode_into(properties, out)
        return _request_rest(out, operation, headers, body, kind)
    content = _CONTENT_TYPE_FIELD[encoding]  # (b"" exactly when content_type is None)
    write_request_properties(out, message_id, _address_fields(reply_to), content, expiry)
    return _request_rest(out, operation, headers, body, kind)


def _request_rest(
    out: bytearray, operation: str, headers: Mapping[str, str] | None, body: object, kind: BodyKind
) -> bytes:
    """A request's bytes: ``out`` (its header and properties), its application-properties
    (the operation's, encoded once, unless there are ``headers`` beside it) and its body."""
    if headers:
        encode_into(ApplicationProperties({**headers, OPERATION: operation}), out)
    else:
        out += _operation_section(operation)
    encode_body(body, kind, out)
    return bytes(out)


_ULONG_MAX = 2**64 - 1
_CONTENT_TYPE_FIELD = {
    e: b"" if e is Encoding.AMQP_VALUE else encode(Symbol(e.value)) for e in Encoding
}
"""The content-type field of a body in each encoding (none for an amqp-value)."""


def _request_head(
    message_id: MessageId | None, now: float, timeout: float | None, reply_to: str | None
) -> tuple[Header | None, Properties]:
    properties = Properties(message_id=message_id, correlation_id=message_id, reply_to=reply_to)
    header = None
    if timeout is not None:
        ttl, properties.absolute_expiry_time = deadline_fields(now, timeout)
        header = Header(ttl=ttl)
    return header, properties


def deadline_fields(now: float, timeout: float) -> tuple[int, datetime.datetime]:
    """A request's ``header.ttl`` and ``properties.absolute-expiry-time`` for ``timeout``."""
    return _ttl_ms(timeout), _EPOCH + datetime.timedelta(seconds=now + timeout)


def _ttl_ms(timeout: float) -> int:
    """A timeout as the header's ttl: whole milliseconds, at least one."""
    return max(1, int(timeout * 1000))


def _expiry_ms(now: float, timeout: float) -> int:
    """The absolute-expiry-time of ``deadline_fields`` in the milliseconds the timestamp
    encoder writes for it, and the same ``OverflowError`` past the datetime range, without
    building the datetime."""
    seconds = now + timeout
    # (the bounds only near them: years 1 and 9999 are ~6.2e10 s either side of 1970)
    if -6e10 < seconds < 2.5e11:  # the microseconds as the timedelta counts them: whole
        whole = int(seconds)  # seconds, the fraction's rounded half to even; then floored
        return (whole * 1_000_000 + round((seconds - whole) * 1e6)) // 1000
    since_epoch = datetime.timedelta(seconds=seconds)
    if not _EARLIEST <= since_epoch <= _LATEST:
        raise OverflowError("date value out of range")
    return since_epoch // _ONE_MS


_EARLIEST = datetime.datetime.min.replace(tzinfo=datetime.UTC) - _EPOCH
_LATEST = datetime.datetime.max.replace(tzinfo=datetime.UTC) - _EPOCH


@functools.lru_cache(maxsize=256)
def _usual_parts(ttl: int, reply_to: str | None, encoding: Encoding) -> tuple[bytes, ...]:
    """The constant bytes of a usual request with this ttl, reply-to and encoding
    (``call_layout.usual_request_parts``), made once each."""
    return usual_request_parts(
        _header_section(ttl), _address_fields(reply_to), _CONTENT_TYPE_FIELD[encoding]
    )


_address_fields = functools.lru_cache(maxsize=256)(address_fields)
"""A request's address fields by reply-to, encoded once each."""


@functools.lru_cache(maxsize=256)
def _header_section(ttl: int) -> bytes:
    return encode(Header(ttl=ttl))


@functools.lru_cache(maxsize=256)
def _operation_section(operation: str) -> bytes:
    return encode(ApplicationProperties({OPERATION: operation}))


def parse_request(message: Message, *, now: float) -> Request:
    """Decode a request; a malformed one raises ``CallError(400)``."""
    props = message.properties or Properties()
    app = message.application_properties or {}
    operation = app.get(OPERATION, props.subject)
    if not isinstance(operation, str) or not operation:
        raise CallError(BAD_REQUEST, "the request names no operation")
    if type(operation) is not str:
        operation = str(operation)  # a symbol, from some stacks
    try:
        value, encoding = decode_value(message)
        args, kwargs = split_arguments(value, encoding)
    except PayloadError as exc:
        raise CallError(BAD_REQUEST, str(exc)) from None
    deadline = None
    if props.absolute_expiry_time is not None:
        deadline = (props.absolute_expiry_time - _EPOCH).total_seconds()
    elif message.header is not None and message.header.ttl is not None:
        deadline = now + message.header.ttl / 1000
    reply_to = props.reply_to
    return Request(
        operation,
        args,
        kwargs,
        props.message_id,
        None if reply_to is None else str(reply_to),
        encoding,
        deadline,
        message,
        props.correlation_id,
    )


def read_request(payload: bytes) -> Request | None:
    """The request in ``payload`` if our client wrote it as it writes every call (the usual
    layout of :mod:`pairlink._amqp.call_layout`, the operation's application-properties
    alone, our envelope or a batch's rows for a body), read without building its message; None
    for anything else, which ``Message.decode`` and :func:`parse_request` read, or refuse, as
    ever. What it returns is what they return for the same bytes: a service reads a request
    per call, and the message most handlers never look at was most of the work."""
    usual = read_usual_request(payload) if type(payload) is bytes else None
    if usual is None or usual.content_type is None:
        return None
    encoding = _USUAL_BODIES.get(usual.content_type)
    if encoding is None:
        return None
    at = usual.sections + 3  # the application-properties' map
    try:
        if not payload.startswith(b"\x00\x53\x74\xc1", usual.sections):
            return None
        end = at + 2 + payload[at + 1]
        operation = _OPERATIONS.get(payload[at:end]) or _operation_named(payload, at, end)
        if operation is None or not payload.startswith(b"\x00\x53\x75", end):
            return None
        start = binary_to_end(payload, end + 3)
        if start is None:
            return None
        value = msgpack_loads(payload, MAX_ELEMENTS, start)
        args, kwargs = split_arguments(value, encoding)
    except (IndexError, struct.error, PayloadError):
        return None
    deadline = usual.expiry_ms / 1000  # (what the datetime's total_seconds() would give)
    return Request(
        operation,
        args,
        kwargs,
        usual.message_id,
        usual.reply_to,
        encoding,
        deadline,
        payload,
    )


_USUAL_BODIES = {ENVELOPE: Encoding.ENVELOPE, BATCH: Encoding.BATCH}
"""The bodies our client writes, by content-type: a call's envelope, a batch's rows."""

_OPERATIONS: dict[bytes, str] = {}
"""The operation named by the bytes of an application-properties map that names only it: a
service is called by a handful of names, each decoded once (cleared when full)."""


def _operation_named(payload: bytes, at: int, end: int) -> str | None:
    """The operation of the application-properties map at ``at`` (ending at ``end``) if it
    names that alone, as a string, remembered by the map's bytes; else None."""
    try:
        app, pos = decode_from(payload, at)
    except DecodeError:
        return None
    if pos != end or len(app) != 1:
        return None
    ((key, operation),) = app.items()
    if type(key) is not str or key != OPERATION or type(operation) is not str or not operation:
        return None
    if len(_OPERATIONS) >= 256:
        _OPERATIONS.clear()
    _OPERATIONS[payload[at:end]] = operation
    return operation


def _reply(request: Request, to: str | None, status: int, description: str) -> Message:
    return Message(
        properties=Properties(correlation_id=request.reply_correlation, to=to),
        application_properties={STATUS_CODE: Int(status), STATUS_DESCRIPTION: description},
    )


def reply_message(request: Request, value: object, *, to: str | None) -> Message:
    """The successful reply (200) to ``request``, in the request's encoding."""
    message = _reply(request, to, OK, "OK")
    set_body(message, value, reply_encoding(request.encoding))
    return message


def with_status(extra: Mapping[str, object], status: int, description: str) -> dict[str, object]:
    """A reply's application-properties: a handler's ``extra`` entries, under the status,
    which they never override."""
    return {**extra, STATUS_CODE: Int(status), STATUS_DESCRIPTION: description}


_OK_STATUS = encode(ApplicationProperties({STATUS_CODE: Int(OK), STATUS_DESCRIPTION: "OK"}))


def encode_reply(
    request: Request, value: object, *, to: str | None, extra: Mapping[str, object] | None = None
) -> bytes:
    """The bytes of ``reply_message(request, value, to=to)``, written without building the
    message: the service sends one for every call, so the constant parts (the properties'
    descriptor and null fields, the content-type, and the status section of every success)
    are bytes encoded once here. ``extra``: application-properties the handler added
    (:func:`with_status`)."""
    encoding = reply_encoding(request.encoding)
    body, kind, content_type = encoded_body(value, encoding)
    correlation_id = request.message_id
    if correlation_id is None:
        correlation_id = request.correlation_id
    out = bytearray()
    if correlation_id is None:  # (the generic encoder drops the trailing nulls)
        encode_into(Properties(to=to, content_type=content_type), out)
    else:
        write_reply_properties(out, to, correlation_id, _CONTENT_TYPE_FIELD[encoding])
    if extra:
        encode_into(ApplicationProperties(with_status(extra, OK, "OK")), out)
    else:
        out += _OK_STATUS
    encode_body(body, kind, out)
    return bytes(out)


_MSGPACK_FIELD = _CONTENT_TYPE_FIELD[Encoding.MSGPACK]
_OK_DATA = _OK_STATUS + b"\x00\x53\x75"
"""What follows the properties of a successful reply as ``encode_reply`` writes it: the status
section, the data section's descriptor."""


def read_reply(payload: bytes) -> tuple[str | int, Decoded] | None:
    """``(correlation-id, value)`` of a successful msgpack reply laid out byte for byte as
    :func:`encode_reply` writes it (a pairlink service's answer to our envelope), read
    without building the message; None for any other reply, which the general path
    (``Message.decode``, :func:`parse_reply`) reads, or refuses, as ever. What this returns
    is what the general path returns for the same bytes (a ulong id as a plain ``int``): a
    client reads every call's reply, and the message it never looks at was most of that."""
    found = read_reply_properties(payload, _MSGPACK_FIELD)
    if found is None:
        return None
    correlation_id, to, end = found
    if (to is not None and to != ME) or not payload.startswith(_OK_DATA, end):
        return None
    try:
        body = binary_to_end(payload, end + len(_OK_DATA))
        if body is None:
            return None
        return correlation_id, msgpack_loads(payload, MAX_ELEMENTS, body)
    except (IndexError, PayloadError):
        return None


REQUEST = register("request", read_request)
"""A service's fast path: a request as our client writes it, read without its message."""
REPLY = register("reply", read_reply)
"""A client's fast path: a successful reply as our service writes it, read without its message."""


def error_message(
    request: Request,
    status: int,
    description: str,
    *,
    to: str | None,
    error_type: str | None = None,
    ref: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> Message:
    """A failure reply: the status and description, the exception type the service discloses,
    and the reference id of its log entry (``ERROR_REF``), when there are such; ``extra``:
    application-properties the handler added (:func:`with_status`)."""
    message = _reply(request, to, status, description)
    app = message.application_properties
    assert app is not None
    if extra:
        message.application_properties = app = with_status(extra, status, description)
    if error_type is not None:
        app[ERROR_TYPE] = error_type
    if ref is not None:
        app[ERROR_REF] = ref
    message.body, message.body_kind = None, "value"
    return message


def parse_reply(message: Message) -> Decoded:
    """The value a reply carries, as plain Python values; a failure reply raises
    ``RemoteError`` with a plain ``int`` status and ``str`` fields, whatever types the service
    sent them as."""
    app = message.application_properties or {}
    status = app.get(STATUS_CODE, OK)
    if not isinstance(status, int) or isinstance(status, bool):
        raise RemoteError(BAD_REQUEST, f"reply status-code {plain(status)!r} is not an integer")
    status = int(status)
    if status != OK:
        description = app.get(STATUS_DESCRIPTION)
        error_type = app.get(ERROR_TYPE)
        ref = app.get(ERROR_REF)
        raise (RemoteTimeoutError if status == TIMEOUT else RemoteError)(
            status,
            "" if description is None else str(plain(description)),
            None if error_type is None else str(plain(error_type)),
            None if ref is None else str(plain(ref)),
        )
    try:
        value, _ = decode_value(message)
    except PayloadError as exc:
        raise RemoteError(BAD_REQUEST, f"undecodable reply: {exc}") from None
    return value


def raise_for_outcome(state: object) -> None:
    """An unsettled request's outcome, as the service said it: only ``accepted`` (or a bare
    settlement, ``None``) means the request is being answered; ``RemoteError`` otherwise."""
    if state is None or isinstance(state, Accepted):
        return
    error = state.error if isinstance(state, Rejected) else None
    condition = str(error.condition) if error is not None else None
    if isinstance(state, Rejected):
        status = NOT_FOUND if condition == conditions.NOT_FOUND else BAD_REQUEST
        description = (error.description if error is not None else None) or "request rejected"
    else:  # released or modified: the service did not take it
        status, description = UNAVAILABLE, f"request {type(state).__name__.lower()}"
    raise RemoteError(status, description, condition)
