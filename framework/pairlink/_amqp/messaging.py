"""The messaging layer (messaging.xml) plus ``error`` (transport.xml), and the ``Message`` facade.

``Error`` lives here rather than in performatives.py: ``rejected`` needs it, and so do
``detach``/``end``/``close``. With ``Error`` here, performatives.py imports from this module and
this module imports nothing from performatives.py, so there is no cycle and no extra module.

Field names, order, type names, mandatory flags and defaults follow the XML exactly; the codec's
``@composite``/``@restricted`` turn each declaration into the encoder, the decoder and the
descriptor lookup, so there is no second copy of any field list.
"""

from __future__ import annotations

import copy
import datetime
import uuid
from typing import Literal, TypeAlias

import attrs

from pairlink._amqp.call_layout import USUAL_HEADER, read_usual_request
from pairlink._amqp.codec import (
    DECODE_FAULTS,
    MAX_ELEMENTS,
    ClassDecoder,
    as_decode_error,
    decode_from,
    decode_more,
    encode_into,
    memoized_maps,
    start_budget,
)
from pairlink._amqp.described import class_decoder, composite, restricted, value_decoder
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.fast_paths import register
from pairlink._amqp.scalars import PLAIN_SCALARS, encode_binary
from pairlink._amqp.types import Buffer, Decoded, Fields, Symbol, amqp_field

__all__ = [
    "DIST_COPY",
    "DIST_MOVE",
    "DURABLE_CONFIGURATION",
    "DURABLE_NONE",
    "DURABLE_UNSETTLED_STATE",
    "EXPIRY_CONNECTION_CLOSE",
    "EXPIRY_LINK_DETACH",
    "EXPIRY_NEVER",
    "EXPIRY_SESSION_END",
    "MESSAGE_FORMAT",
    "Accepted",
    "AmqpSequence",
    "AmqpValue",
    "ApplicationProperties",
    "BodyKind",
    "Data",
    "DeleteOnClose",
    "DeleteOnNoLinks",
    "DeleteOnNoLinksOrMessages",
    "DeleteOnNoMessages",
    "DeliveryAnnotations",
    "DeliveryState",
    "Error",
    "Footer",
    "Header",
    "Message",
    "MessageAnnotations",
    "MessageId",
    "Modified",
    "Outcome",
    "Properties",
    "Received",
    "Rejected",
    "Released",
    "Source",
    "Target",
    "bare_message_span",
]

#: messaging.xml ``MESSAGE-FORMAT``: the transfer ``message-format`` of the messages defined here.
MESSAGE_FORMAT = 0

# terminus-durability (uint)
DURABLE_NONE = 0
DURABLE_CONFIGURATION = 1
DURABLE_UNSETTLED_STATE = 2
# terminus-expiry-policy (symbol)
EXPIRY_LINK_DETACH = Symbol("link-detach")
EXPIRY_SESSION_END = Symbol("session-end")
EXPIRY_CONNECTION_CLOSE = Symbol("connection-close")
EXPIRY_NEVER = Symbol("never")
# std-dist-mode (symbol)
DIST_MOVE = Symbol("move")
DIST_COPY = Symbol("copy")


# --------------------------------------------------------------------------------------------
# transport.xml: error
# --------------------------------------------------------------------------------------------


@composite(code=0x1D, name="amqp:error:list")
class Error:
    """Why a link, session, connection or delivery failed (``condition`` from errors.py)."""

    condition: str = amqp_field("symbol", mandatory=True)
    description: str | None = amqp_field("string")
    info: Fields | None = amqp_field("fields")


# --------------------------------------------------------------------------------------------
# message sections
# --------------------------------------------------------------------------------------------


@composite(code=0x70, name="amqp:header:list", provides=("section",))
class Header:
    """Transport headers: durability, priority, ttl and redelivery count (not bare message)."""

    durable: bool = amqp_field("boolean", default=False)
    priority: int = amqp_field("ubyte", default=4)
    ttl: int | None = amqp_field("milliseconds")
    first_acquirer: bool = amqp_field("boolean", default=False)
    delivery_count: int = amqp_field("uint", default=0)


@restricted(
    code=0x71, name="amqp:delivery-annotations:map", source="annotations", provides=("section",)
)
class DeliveryAnnotations:
    """Hop-by-hop annotations, consumed by the next node."""

    value: dict[Decoded, Decoded]


@restricted(
    code=0x72, name="amqp:message-annotations:map", source="annotations", provides=("section",)
)
class MessageAnnotations:
    """Annotations that travel with the message through intermediaries."""

    value: dict[Decoded, Decoded]


MessageId: TypeAlias = int | uuid.UUID | bytes | str
"""A message-id or correlation-id (messaging.xml: ulong, uuid, binary or string): a plain
``int`` goes out as a ulong, a decoded ulong comes back as ``ULong`` (an ``int``)."""


@composite(code=0x73, name="amqp:properties:list", provides=("section",))
class Properties:
    """Immutable standard properties (first section of the bare message).

    ``message_id``/``correlation_id`` take a ulong, uuid, binary or string; a plain ``int`` goes
    out as ulong (a ``long`` is no legal message-id).
    """

    message_id: MessageId | None = amqp_field("message-id")
    user_id: bytes | None = amqp_field("binary")
    to: str | None = amqp_field("address")
    subject: str | None = amqp_field("string")
    reply_to: str | None = amqp_field("address")
    correlation_id: MessageId | None = amqp_field("message-id")
    content_type: str | None = amqp_field("symbol")
    content_encoding: str | None = amqp_field("symbol")
    absolute_expiry_time: datetime.datetime | None = amqp_field("timestamp")
    creation_time: datetime.datetime | None = amqp_field("timestamp")
    group_id: str | None = amqp_field("string")
    group_sequence: int | None = amqp_field("sequence-no")
    reply_to_group_id: str | None = amqp_field("string")


@restricted(code=0x74, name="amqp:application-properties:map", source="map", provides=("section",))
class ApplicationProperties:
    """String-keyed simple values for routing and filtering (bare message)."""

    value: dict[Decoded, Decoded]


@restricted(code=0x75, name="amqp:data:binary", source="binary", provides=("section",))
class Data:
    """One opaque binary body section."""

    value: bytes


@restricted(code=0x76, name="amqp:amqp-sequence:list", source="list", provides=("section",))
class AmqpSequence:
    """One list-of-values body section."""

    value: list[Decoded]


@restricted(code=0x77, name="amqp:amqp-value:*", source="*", provides=("section",))
class AmqpValue:
    """The single AMQP value body section."""

    value: Decoded


@restricted(code=0x78, name="amqp:footer:map", source="annotations", provides=("section",))
class Footer:
    """Annotations computed over the whole bare message (hashes, signatures)."""

    value: dict[Decoded, Decoded]


# --------------------------------------------------------------------------------------------
# delivery states
# --------------------------------------------------------------------------------------------


@composite(code=0x23, name="amqp:received:list", provides=("delivery-state",))
class Received:
    """Non-terminal state: how far the payload got (for resuming a delivery)."""

    section_number: int = amqp_field("uint", mandatory=True)
    section_offset: int = amqp_field("ulong", mandatory=True)


@composite(
    code=0x24,
    name="amqp:accepted:list",
    provides=(
        "delivery-state",
        "outcome",
    ),
)
class Accepted:
    """Outcome: processed successfully."""


@composite(
    code=0x25,
    name="amqp:rejected:list",
    provides=(
        "delivery-state",
        "outcome",
    ),
)
class Rejected:
    """Outcome: invalid and unprocessable; ``error`` says why."""

    error: Error | None = amqp_field("error")


@composite(
    code=0x26,
    name="amqp:released:list",
    provides=(
        "delivery-state",
        "outcome",
    ),
)
class Released:
    """Outcome: not acted upon; may be redelivered unchanged."""


@composite(
    code=0x27,
    name="amqp:modified:list",
    provides=(
        "delivery-state",
        "outcome",
    ),
)
class Modified:
    """Outcome: not acted upon; the node should modify the message as described."""

    delivery_failed: bool | None = amqp_field("boolean")
    undeliverable_here: bool | None = amqp_field("boolean")
    message_annotations: Fields | None = amqp_field("fields")


DeliveryState: TypeAlias = "Received | Accepted | Rejected | Released | Modified"
Outcome: TypeAlias = "Accepted | Rejected | Released | Modified"


# --------------------------------------------------------------------------------------------
# addressing
# --------------------------------------------------------------------------------------------


@composite(code=0x28, name="amqp:source:list", provides=("source",))
class Source:
    """The source terminus of a link (``durable``/``expiry_policy``: the constants above)."""

    address: str | None = amqp_field("address")
    durable: int = amqp_field("terminus-durability", default=DURABLE_NONE)
    expiry_policy: str = amqp_field("terminus-expiry-policy", default=EXPIRY_SESSION_END)
    timeout: int = amqp_field("seconds", default=0)
    dynamic: bool = amqp_field("boolean", default=False)
    dynamic_node_properties: Fields | None = amqp_field("node-properties")
    distribution_mode: str | None = amqp_field("symbol")
    filter: dict[Decoded, Decoded] | None = amqp_field("filter-set")
    default_outcome: Outcome | None = amqp_field("outcome")
    outcomes: list[Symbol] | None = amqp_field("symbol", multiple=True)
    capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)


@composite(code=0x29, name="amqp:target:list", provides=("target",))
class Target:
    """The target terminus of a link."""

    address: str | None = amqp_field("address")
    durable: int = amqp_field("terminus-durability", default=DURABLE_NONE)
    expiry_policy: str = amqp_field("terminus-expiry-policy", default=EXPIRY_SESSION_END)
    timeout: int = amqp_field("seconds", default=0)
    dynamic: bool = amqp_field("boolean", default=False)
    dynamic_node_properties: Fields | None = amqp_field("node-properties")
    capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)


@composite(code=0x2B, name="amqp:delete-on-close:list", provides=("lifetime-policy",))
class DeleteOnClose:
    """Lifetime policy: delete the dynamic node when the creating link closes."""


@composite(code=0x2C, name="amqp:delete-on-no-links:list", provides=("lifetime-policy",))
class DeleteOnNoLinks:
    """Lifetime policy: delete the node once it has no links."""


@composite(code=0x2D, name="amqp:delete-on-no-messages:list", provides=("lifetime-policy",))
class DeleteOnNoMessages:
    """Lifetime policy: delete the node once it holds no messages."""


@composite(
    code=0x2E, name="amqp:delete-on-no-links-or-messages:list", provides=("lifetime-policy",)
)
class DeleteOnNoLinksOrMessages:
    """Lifetime policy: delete the node once it has neither links nor messages."""


# --------------------------------------------------------------------------------------------
# Message
# --------------------------------------------------------------------------------------------

BodyKind: TypeAlias = Literal["value", "data", "sequence"]

# Section order of the message format: each section at most once, in this order, except that a
# body of data or of amqp-sequence sections may repeat its own kind.
_HEADER, _DA, _MA, _PROPS, _APP, _BODY, _FOOTER = range(7)
_RANK: dict[type, int] = {
    Header: _HEADER,
    DeliveryAnnotations: _DA,
    MessageAnnotations: _MA,
    Properties: _PROPS,
    ApplicationProperties: _APP,
    Data: _BODY,
    AmqpSequence: _BODY,
    AmqpValue: _BODY,
    Footer: _FOOTER,
}
_RANK_BY_CODE: dict[int, int] = {
    c.__amqp_descriptor__[0]: r  # type: ignore[attr-defined]
    for c, r in _RANK.items()
}
_REPEATABLE_CODES = (0x75, 0x76)


def _out_of_order(name: str) -> DecodeError:
    return DecodeError(f"message section {name} is out of order or repeated")


@attrs.define
class Message:
    """An annotated message of format 0: header, annotations, bare message, footer.

    Body by ``body_kind``: ``"value"``, one amqp-value section holding ``body``; ``"data"``,
    ``bytes`` for one data section or ``list[bytes]`` for several; ``"sequence"``, a list of
    amqp-sequence sections, each a list of values (always the outer list, since one section and
    several would otherwise look alike). Annotation and property sections are plain dicts
    (annotation keys: ``Symbol``, or ``ULong`` for the reserved numeric ones; ``str`` keys go out
    as symbols).
    """

    body: Decoded = None
    body_kind: BodyKind = "value"
    header: Header | None = None
    delivery_annotations: dict[Decoded, Decoded] | None = None
    message_annotations: dict[Decoded, Decoded] | None = None
    properties: Properties | None = None
    application_properties: dict[Decoded, Decoded] | None = None
    footer: dict[Decoded, Decoded] | None = None

    def encode(self) -> bytes:
        """The sections in spec order, ready to be a transfer payload.

        The body section is always written (the spec requires one): ``body=None`` with kind
        ``"value"`` is an amqp-value null.
        """
        out = bytearray()
        if self.header is not None:
            encode_into(self.header, out)
        if self.delivery_annotations is not None:
            encode_into(DeliveryAnnotations(self.delivery_annotations), out)
        if self.message_annotations is not None:
            encode_into(MessageAnnotations(self.message_annotations), out)
        if self.properties is not None:
            encode_into(self.properties, out)
        if self.application_properties is not None:
            encode_into(ApplicationProperties(self.application_properties), out)
        encode_body(self.body, self.body_kind, out)
        if self.footer is not None:
            encode_into(Footer(self.footer), out)
        return bytes(out)

    @classmethod
    def decode(
        cls, payload: bytes | bytearray | memoryview, max_elements: int = MAX_ELEMENTS
    ) -> Message:
        """Parse a whole transfer payload; ``DecodeError`` on junk, bad order or mixed bodies,
        and on more than ``max_elements`` values in all its sections together (codec.py's
        ``MAX_ELEMENTS``: what bounds the memory and time one message may cost to decode).

        A message without a body section (Proton writes those) decodes with ``body=None``. A
        call's request as our client writes it is read in one pass first (``USUAL_MESSAGE``).
        A section under the usual ``0x00 0x53 code`` descriptor is decoded here by its own
        decoder (``_SECTION_DEC``) rather than through ``decode_from``: that skips the generic
        descriptor dispatch and, for the map/binary/value sections, the wrapper object that
        would only be unwrapped again. Anything else takes the general path; both raise the
        same errors for the same bytes.
        """
        if type(payload) is bytes and payload.startswith(USUAL_HEADER):
            quick = USUAL_MESSAGE.read(payload, max_elements)
            if quick is not None:
                return quick
        msg = cls()
        end = len(payload)
        pos = 0
        last = -1
        body_code = -1
        chunks: list[Decoded] = []
        fast = _SECTION_DEC
        start_budget(max_elements)
        try:
            while pos < end:
                usual = None
                if payload[pos] == 0 and payload[pos + 1] == 0x53:
                    code = payload[pos + 2]
                    usual = fast.get(code)
                if usual is not None:
                    rank, dec = usual
                    value, pos = dec(payload[pos + 3], payload, pos + 4, 1)
                else:
                    section, pos = decode_more(payload, pos)
                    tp = type(section)
                    rank = _RANK.get(tp, -1)
                    if rank < 0:
                        raise DecodeError(f"not a message section: {tp.__name__}")
                    code = tp.__amqp_descriptor__[0]
                    value = section if rank in (_HEADER, _PROPS) else section.value
                if rank <= last and (code != body_code or code not in _REPEATABLE_CODES):
                    raise _out_of_order(_NAME_BY_CODE[code])
                last = rank
                if rank == _BODY:
                    body_code = code
                    chunks.append(value)
                elif rank == _PROPS:
                    msg.properties = value
                elif rank == _APP:
                    msg.application_properties = value
                elif rank == _HEADER:
                    msg.header = value
                elif rank == _MA:
                    msg.message_annotations = value
                elif rank == _DA:
                    msg.delivery_annotations = value
                else:
                    msg.footer = value
        except DECODE_FAULTS as exc:
            raise as_decode_error(exc) from None
        if body_code >= 0:
            kind = msg.body_kind = _BODY_KIND_BY_CODE[body_code]
            if kind == "sequence" or len(chunks) > 1:
                msg.body = chunks
            else:
                msg.body = chunks[0]
        return msg


_TIMESTAMP = PLAIN_SCALARS["timestamp"][0x83]
_FAULTS = (DecodeError, *DECODE_FAULTS)


def _decode_usual(payload: bytes, max_elements: int) -> Message | None:
    """A request as a client of ours writes it (:mod:`pairlink._amqp.call_layout`), read in
    one pass into the very message the generic path would build; None for anything else (or
    anything wrong), which the generic path then reads, or refuses, as ever."""
    usual = read_usual_request(payload)
    if usual is None:
        return None
    pos = usual.sections
    try:
        if not payload.startswith(b"\x00\x53\x74", pos):
            return None
        start_budget(max_elements)
        app, pos = _SECTION_DEC[0x74][1](payload[pos + 3], payload, pos + 4, 1)
        if not payload.startswith(b"\x00\x53\x75", pos):
            return None
        body, pos = _SECTION_DEC[0x75][1](payload[pos + 3], payload, pos + 4, 1)
        if pos != len(payload):
            return None
    except _FAULTS:
        return None
    message_id = usual.message_id
    header = Header(False, 4, usual.ttl, False, 0)
    expiry = _TIMESTAMP(payload, usual.sections - 8, 1)[0]
    properties = Properties(
        message_id, None, None, None, usual.reply_to, message_id, usual.content_type, None, expiry
    )
    return Message(body, "data", header, None, None, properties, app)


USUAL_MESSAGE = register("usual-message", _decode_usual)
"""``Message.decode``'s fast path: a call's request as our client writes it."""


_VALUE_START = b"\x00\x53\x77"  # the small-ulong descriptor of amqp:amqp-value:*
_DATA_START = b"\x00\x53\x75"  # ... and of amqp:data:binary


def encode_body(body: object, kind: BodyKind, out: bytearray) -> None:
    """Append the body section(s) of a ``Message`` with this ``body`` and ``body_kind`` (see
    there) to ``out``: for a caller that writes the sections before it itself, as wire.py does
    for every call, without building the whole ``Message``. The two usual bodies (one
    amqp-value, one data section of ``bytes``) are written as their constant descriptor and
    the value, without the section object the codec would dispatch on."""
    if kind == "value":
        out += _VALUE_START
        encode_into(body, out)
    elif kind == "data":
        if type(body) is bytes:
            out += _DATA_START
            encode_binary(body, out)
        elif isinstance(body, (bytes, bytearray, memoryview)):
            encode_into(Data(body), out)  # type: ignore[arg-type]  # the codec takes any buffer
        elif isinstance(body, list) and body:
            for chunk in body:
                encode_into(Data(chunk), out)
        else:
            raise ValueError("a data body is bytes or a non-empty list of bytes")
    elif kind == "sequence":
        if not isinstance(body, list) or not body:
            raise ValueError("a sequence body is a non-empty list of sections (lists)")
        for seq in body:
            encode_into(AmqpSequence(seq), out)
    else:
        raise ValueError(f"unknown body_kind {kind!r}")


# Per section descriptor code: its rank and the decoder of what ``Message`` keeps of it (the
# ``Header``/``Properties`` instance; the value alone of the other, restricted, sections).
_SECTION_DEC: dict[int, tuple[int, ClassDecoder]] = {
    c.__amqp_descriptor__[0]: (  # type: ignore[attr-defined]
        r,
        class_decoder(c) if r in (_HEADER, _PROPS) else value_decoder(c),
    )
    for c, r in _RANK.items()
}
for _code in (0x72, 0x74):  # annotations and application-properties: mostly repeated bytes
    _SECTION_DEC[_code] = (_SECTION_DEC[_code][0], memoized_maps(_SECTION_DEC[_code][1]))
_NAME_BY_CODE: dict[int, str] = {
    c.__amqp_descriptor__[0]: c.__name__  # type: ignore[attr-defined]
    for c in _RANK
}
_BODY_KIND_BY_CODE: dict[int, BodyKind] = {0x75: "data", 0x76: "sequence", 0x77: "value"}


# Constructors whose encoding states its own length, so a section can be stepped over without
# decoding it: one size byte after the constructor, or four (binary/string/symbol sizes count
# the bytes that follow; list/map/array sizes too, which is the same arithmetic).
_SIZED_1 = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_SIZED_4 = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))


def _next_section(buf: Buffer, pos: int) -> tuple[int, int]:
    """(descriptor code, end offset) of the section at ``pos``, skipping its value when the
    usual ``0x00 0x53 code`` descriptor and a sized encoding make that possible."""
    n = len(buf)
    if pos + 4 <= n and buf[pos] == 0 and buf[pos + 1] == 0x53:
        code = buf[pos + 2]
        c = buf[pos + 3]
        end = -1
        if c in _SIZED_1:
            end = pos + 5 + buf[pos + 4] if pos + 5 <= n else n + 1
        elif c in _SIZED_4:
            end = pos + 8 + int.from_bytes(buf[pos + 4 : pos + 8], "big") if pos + 8 <= n else n + 1
        if end > n:
            raise DecodeError("message section runs past the end of the payload")
        if end >= 0 and code in _RANK_BY_CODE:
            return code, end
    section, end = decode_more(buf, pos)
    desc = getattr(type(section), "__amqp_descriptor__", None)
    if desc is None or type(section) not in _RANK:
        raise DecodeError(f"not a message section: {type(section).__name__}")
    return desc[0], end


def bare_message_span(payload: bytes | bytearray | memoryview) -> tuple[int, int]:
    """``[start, end)`` of the bare message (properties through body) within ``payload``.

    A gateway may rewrite the header and annotations but must forward the bare message byte for
    byte (signatures and hashes cover its exact encoding). Sections with a sized encoding are
    stepped over, not decoded, so a 1 MiB body costs what a 1 KiB one does. Checks section
    kinds and order (``DecodeError``), not the contents of what it skips; what it does decode
    shares one ``MAX_ELEMENTS`` budget.
    """
    start_budget()
    end = len(payload)
    pos = 0
    start = -1
    last_rank = -1
    last_code = -1
    while pos < end:
        code, nxt = _next_section(payload, pos)
        rank = _RANK_BY_CODE[code]
        if rank <= last_rank and (code != last_code or code not in _REPEATABLE_CODES):
            raise _out_of_order(hex(code))
        if rank >= _PROPS and start < 0:
            start = pos
        if rank == _FOOTER:
            if nxt != end:
                raise _out_of_order("after footer")
            return start, pos
        last_rank, last_code = rank, code
        pos = nxt
    return (start if start >= 0 else end), end


def decode_head(payload: bytes | bytearray | memoryview) -> Message:
    """The message without its body: the sections before it decoded, the body (and footer)
    stepped over, not decoded. What a service reads of a request whose body it cannot decode,
    to answer it on its reply path; ``DecodeError`` if the head itself is junk."""
    end = len(payload)
    pos = 0
    try:
        while pos < end:
            usual = payload[pos] == 0 and payload[pos + 1] == 0x53  # 0x00 0x53 code
            if usual and _RANK_BY_CODE.get(payload[pos + 2], -1) >= _BODY:
                break  # a body by its descriptor: not a byte of it is read
            code, nxt = _next_section(payload, pos)
            if _RANK_BY_CODE[code] >= _BODY:
                break
            pos = nxt
    except DECODE_FAULTS as exc:
        raise as_decode_error(exc) from None
    return Message.decode(payload[:pos])


_HEADER_START = b"\x00\x53\x70"  # described by the small-ulong code of amqp:header:list


def with_ttl_reduced(payload: bytes, elapsed_ms: int) -> bytes:
    """``payload`` with its header's ``ttl`` cut by ``elapsed_ms``: what an intermediary
    that held a message may change (the header is not part of the bare message). At least 1
    is left: declaring the message expired is the receiver's call. The same object comes back
    when there is nothing to cut."""
    if elapsed_ms <= 0 or payload[:3] != _HEADER_START:
        return payload
    header, end = decode_from(payload, 0)
    if not isinstance(header, Header) or header.ttl is None:
        return payload
    reduced = copy.copy(header)
    reduced.ttl = max(1, header.ttl - elapsed_ms)
    out = bytearray()
    encode_into(reduced, out)
    return bytes(out) + payload[end:]
