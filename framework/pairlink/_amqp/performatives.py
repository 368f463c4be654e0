"""The AMQP frame bodies: transport performatives (transport.xml) and SASL frames (security.xml).

Each class is declared once with ``@composite``, which gives the codec its encoder, its decoder
and its place in the descriptor lookup. Fields are the spec's names with '-' -> '_', in the
spec's order, declared with the spec's own type names (``handle``, ``role``, ``sasl-code``...),
which the codec resolves to their wire types, so each line can be checked against the XML as is.
``Error``, the delivery states and the termini come from messaging.py, which imports nothing
from here (no cycle).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeAlias, TypeVar

from pairlink._amqp import messaging
from pairlink._amqp.described import composite, registered_class
from pairlink._amqp.messaging import DeliveryState, Error, Source, Target
from pairlink._amqp.types import Decoded, Fields, Symbol, amqp_field

__all__ = [
    "AMQP_PERFORMATIVES",
    "MIN_MAX_FRAME_SIZE",
    "PERFORMATIVES_BY_CODE",
    "PERFORMATIVES_BY_NAME",
    "RCV_FIRST",
    "RCV_SECOND",
    "ROLE_RECEIVER",
    "ROLE_SENDER",
    "SASL_AUTH",
    "SASL_OK",
    "SASL_PERFORMATIVES",
    "SASL_SYS",
    "SASL_SYS_PERM",
    "SASL_SYS_TEMP",
    "SND_MIXED",
    "SND_SETTLED",
    "SND_UNSETTLED",
    "SPEC_CLASSES",
    "Attach",
    "Begin",
    "Close",
    "Detach",
    "Disposition",
    "End",
    "Flow",
    "Open",
    "Performative",
    "SaslChallenge",
    "SaslFrame",
    "SaslInit",
    "SaslMechanisms",
    "SaslOutcome",
    "SaslResponse",
    "Transfer",
]

# role (boolean)
ROLE_SENDER = False
ROLE_RECEIVER = True
# sender-settle-mode (ubyte)
SND_UNSETTLED = 0
SND_SETTLED = 1
SND_MIXED = 2
# receiver-settle-mode (ubyte)
RCV_FIRST = 0
RCV_SECOND = 1
# sasl-code (ubyte)
SASL_OK = 0
SASL_AUTH = 1
SASL_SYS = 2
SASL_SYS_PERM = 3
SASL_SYS_TEMP = 4
# transport.xml definitions (its port numbers are pairlink._io.net.AMQP_PORT and AMQPS_PORT)
MIN_MAX_FRAME_SIZE = 512

_UINT_MAX = 4294967295


@composite(code=0x10, name="amqp:open:list", provides=("frame",))
class Open:
    """Connection parameters each side announces once, first thing after the header."""

    container_id: str = amqp_field("string", mandatory=True)
    hostname: str | None = amqp_field("string")
    max_frame_size: int = amqp_field("uint", default=_UINT_MAX)
    channel_max: int = amqp_field("ushort", default=65535)
    idle_time_out: int | None = amqp_field("milliseconds")
    outgoing_locales: list[Symbol] | None = amqp_field("ietf-language-tag", multiple=True)
    incoming_locales: list[Symbol] | None = amqp_field("ietf-language-tag", multiple=True)
    offered_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    properties: Fields | None = amqp_field("fields")


@composite(code=0x11, name="amqp:begin:list", provides=("frame",))
class Begin:
    """Starts a session on a channel (``remote_channel`` set when answering the peer's begin)."""

    remote_channel: int | None = amqp_field("ushort")
    next_outgoing_id: int = amqp_field("transfer-number", mandatory=True)
    incoming_window: int = amqp_field("uint", mandatory=True)
    outgoing_window: int = amqp_field("uint", mandatory=True)
    handle_max: int = amqp_field("handle", default=_UINT_MAX)
    offered_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    properties: Fields | None = amqp_field("fields")


@composite(code=0x12, name="amqp:attach:list", provides=("frame",))
class Attach:
    """Attaches a link endpoint to a session (``role``: ROLE_SENDER / ROLE_RECEIVER)."""

    name: str = amqp_field("string", mandatory=True)
    handle: int = amqp_field("handle", mandatory=True)
    role: bool = amqp_field("role", mandatory=True)
    snd_settle_mode: int = amqp_field("sender-settle-mode", default=SND_MIXED)
    rcv_settle_mode: int = amqp_field("receiver-settle-mode", default=RCV_FIRST)
    source: Source | None = amqp_field("source")
    target: Target | None = amqp_field("target")
    unsettled: dict[Decoded, Decoded] | None = amqp_field("map")
    incomplete_unsettled: bool = amqp_field("boolean", default=False)
    initial_delivery_count: int | None = amqp_field("sequence-no")
    max_message_size: int | None = amqp_field("ulong")
    offered_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    desired_capabilities: list[Symbol] | None = amqp_field("symbol", multiple=True)
    properties: Fields | None = amqp_field("fields")


@composite(code=0x13, name="amqp:flow:list", provides=("frame",))
class Flow:
    """Session windows and, with ``handle``, one link's credit."""

    next_incoming_id: int | None = amqp_field("transfer-number")
    incoming_window: int = amqp_field("uint", mandatory=True)
    next_outgoing_id: int = amqp_field("transfer-number", mandatory=True)
    outgoing_window: int = amqp_field("uint", mandatory=True)
    handle: int | None = amqp_field("handle")
    delivery_count: int | None = amqp_field("sequence-no")
    link_credit: int | None = amqp_field("uint")
    available: int | None = amqp_field("uint")
    drain: bool = amqp_field("boolean", default=False)
    echo: bool = amqp_field("boolean", default=False)
    properties: Fields | None = amqp_field("fields")


@composite(code=0x14, name="amqp:transfer:list", provides=("frame",))
class Transfer:
    """One frame of a delivery; the message bytes follow it as the frame payload."""

    handle: int = amqp_field("handle", mandatory=True)
    delivery_id: int | None = amqp_field("delivery-number")
    delivery_tag: bytes | None = amqp_field("delivery-tag")
    message_format: int | None = amqp_field("message-format")
    settled: bool | None = amqp_field("boolean")
    more: bool = amqp_field("boolean", default=False)
    rcv_settle_mode: int | None = amqp_field("receiver-settle-mode")
    state: DeliveryState | None = amqp_field("delivery-state")
    resume: bool = amqp_field("boolean", default=False)
    aborted: bool = amqp_field("boolean", default=False)
    batchable: bool = amqp_field("boolean", default=False)


@composite(code=0x15, name="amqp:disposition:list", provides=("frame",))
class Disposition:
    """State and settlement of the deliveries ``first``..``last`` (inclusive)."""

    role: bool = amqp_field("role", mandatory=True)
    first: int = amqp_field("delivery-number", mandatory=True)
    last: int | None = amqp_field("delivery-number")
    settled: bool = amqp_field("boolean", default=False)
    state: DeliveryState | None = amqp_field("delivery-state")
    batchable: bool = amqp_field("boolean", default=False)


@composite(code=0x16, name="amqp:detach:list", provides=("frame",))
class Detach:
    """Detaches (``closed=True``: closes) a link endpoint."""

    handle: int = amqp_field("handle", mandatory=True)
    closed: bool = amqp_field("boolean", default=False)
    error: Error | None = amqp_field("error")


@composite(code=0x17, name="amqp:end:list", provides=("frame",))
class End:
    """Ends a session."""

    error: Error | None = amqp_field("error")


@composite(code=0x18, name="amqp:close:list", provides=("frame",))
class Close:
    """Closes the connection."""

    error: Error | None = amqp_field("error")


@composite(code=0x40, name="amqp:sasl-mechanisms:list", provides=("sasl-frame",))
class SaslMechanisms:
    """The server's mechanisms, offered once after the SASL header."""

    sasl_server_mechanisms: list[Symbol] = amqp_field("symbol", mandatory=True, multiple=True)


@composite(code=0x41, name="amqp:sasl-init:list", provides=("sasl-frame",))
class SaslInit:
    """The client's chosen mechanism and its initial response."""

    mechanism: str = amqp_field("symbol", mandatory=True)
    initial_response: bytes | None = amqp_field("binary")
    hostname: str | None = amqp_field("string")


@composite(code=0x42, name="amqp:sasl-challenge:list", provides=("sasl-frame",))
class SaslChallenge:
    """A server challenge (multi-step mechanisms)."""

    challenge: bytes = amqp_field("binary", mandatory=True)


@composite(code=0x43, name="amqp:sasl-response:list", provides=("sasl-frame",))
class SaslResponse:
    """The client's answer to a challenge."""

    response: bytes = amqp_field("binary", mandatory=True)


@composite(code=0x44, name="amqp:sasl-outcome:list", provides=("sasl-frame",))
class SaslOutcome:
    """The end of SASL: ``code`` is one of the SASL_* constants."""

    code: int = amqp_field("sasl-code", mandatory=True)
    additional_data: bytes | None = amqp_field("binary")


Performative: TypeAlias = (
    "Open | Begin | Attach | Flow | Transfer | Disposition | Detach | End | Close"
)
SaslFrame: TypeAlias = "SaslMechanisms | SaslInit | SaslChallenge | SaslResponse | SaslOutcome"

#: What may be the body of an AMQP frame (type 0) and of a SASL frame (type 1): framing.py
#: checks decoded bodies against these.
AMQP_PERFORMATIVES: frozenset[type] = frozenset(
    {Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close}
)
SASL_PERFORMATIVES: frozenset[type] = frozenset(
    {SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome}
)

#: Every described type of transport.xml, messaging.xml and security.xml, in spec order.
SPEC_CLASSES: tuple[type, ...] = (
    Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close, messaging.Error,
    messaging.Header, messaging.DeliveryAnnotations, messaging.MessageAnnotations,
    messaging.Properties, messaging.ApplicationProperties, messaging.Data,
    messaging.AmqpSequence, messaging.AmqpValue, messaging.Footer, messaging.Received,
    messaging.Accepted, messaging.Rejected, messaging.Released, messaging.Modified,
    messaging.Source, messaging.Target, messaging.DeleteOnClose, messaging.DeleteOnNoLinks,
    messaging.DeleteOnNoMessages, messaging.DeleteOnNoLinksOrMessages,
    SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome,
)  # fmt: skip

_K = TypeVar("_K", int, str)


class _DescriptorLookup(Mapping[_K, type], Generic[_K]):
    """A read-only view of the codec's descriptor registry restricted to ``SPEC_CLASSES``.

    The codec already maps codes and symbolic names to classes for decoding; this view answers
    from that registry instead of keeping a second table that could drift from it.
    """

    __slots__ = ("_key_type", "_part")

    def __init__(self, part: int, key_type: type[_K]) -> None:
        self._part = part  # index into __amqp_descriptor__: 0 the code, 1 the name
        self._key_type: type[_K] = key_type

    def __getitem__(self, key: _K) -> type:
        cls = registered_class(key) if isinstance(key, self._key_type) else None
        if cls is None or cls not in _SPEC_SET:
            raise KeyError(key)
        return cls

    def __iter__(self) -> Iterator[_K]:
        part = self._part
        return (getattr(c, "__amqp_descriptor__")[part] for c in SPEC_CLASSES)  # noqa: B009

    def __len__(self) -> int:
        return len(SPEC_CLASSES)


_SPEC_SET = frozenset(SPEC_CLASSES)
#: Spec class by ulong descriptor code (``0x10`` -> ``Open``), messaging and SASL types too.
PERFORMATIVES_BY_CODE: Mapping[int, type] = _DescriptorLookup(0, int)
#: Spec class by symbolic descriptor (``"amqp:open:list"`` -> ``Open``).
PERFORMATIVES_BY_NAME: Mapping[str, type] = _DescriptorLookup(1, str)
