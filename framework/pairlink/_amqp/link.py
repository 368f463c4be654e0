"""Link endpoint state (Part 2 §2.6): handles, roles, credit, deliveries and reassembly.

A ``Link`` only keeps state and checks rules; the session owns delivery-id allocation and
windows, the connection writes frames. A link knows its session as a ``LinkSession``: session.py
builds links, so naming its ``Session`` here would be an import cycle. Sequence numbers
(delivery-count, delivery-id) are RFC-1982 serial numbers modulo 2**32, so the arithmetic lives
here in one place; link-credit is a plain uint (2**31 and more is a common "unlimited"), never
compared as a serial number.

What a peer can make a link hold is bounded: the bytes of an incomplete incoming message (per
link by ``max_message_size``, per connection by ``IncomingBytes``) and the unsettled
deliveries (``max_unsettled``, both directions; the session bounds them too).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from . import errors
from .performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED, Attach, Flow, Transfer

if TYPE_CHECKING:
    from .messaging import DeliveryState, Error, Source, Target
    from .types import Fields, Symbol

SERIAL_MOD = 1 << 32
SERIAL_MASK = SERIAL_MOD - 1
UINT_MAX = SERIAL_MASK
MAX_DELIVERY_TAG = 32
"""transport.xml's delivery-tag: at most 32 bytes (a longer one is an invalid field)."""

MAX_UNSETTLED = 4096
"""Default bound on a link's unsettled deliveries (``ConnectionConfig.max_unsettled``), each
~200 bytes: above the 1,000 replies a client grants credit for and a 1,024-call mailbox, so no
pairlink peer meets it; a sender at it has no usable credit, a peer that sends past it has its
link detached with ``amqp:resource-limit-exceeded``."""

MAX_INCOMPLETE_BYTES = 64 * 2**20
"""Default bound on the bytes of incomplete incoming messages one connection holds, across all
its links (``ConnectionConfig.max_incomplete_bytes``). The size of the largest message we take
by default: one such message always fits, and a peer that starts many at once, on as many
links, holds no more than one would (8 never-ending ones held 461 MiB before)."""


def serial_add(a: int, n: int) -> int:
    """``a + n`` for serial numbers (the per-frame paths write ``(a + 1) & SERIAL_MASK``)."""
    return (a + n) & SERIAL_MASK


def serial_diff(a: int, b: int) -> int:
    """``a - b`` for serial numbers: negative when ``a`` is behind ``b``."""
    d = (a - b) & SERIAL_MASK
    return d - SERIAL_MOD if d >= 1 << 31 else d


class LinkState(enum.Enum):
    ATTACH_SENT = "attach-sent"  # ours went out, the peer's has not come
    ATTACH_RECEIVED = "attach-received"  # the peer's came, ours is still owed
    ATTACHED = "attached"
    DETACH_SENT = "detach-sent"  # ours went out, frames for the link are dropped until theirs
    DETACHED = "detached"


@attrs.define
class IncomingBytes:
    """The bytes of incomplete incoming messages that all links of one connection hold."""

    limit: int
    held: int = 0


class Held(Protocol):
    """What a link reads of its session's table of our unsettled deliveries (unsettled.py,
    which builds on this module): how many it holds."""

    held: int


class LinkSession(Protocol):
    """What is used of a link's session through the link (``Session`` is one): its channel and
    the connection's bound on incomplete bytes, which the link itself uses, and the actions
    the connection takes on the link's behalf."""

    channel: int
    incoming: IncomingBytes
    max_unsettled: int  # the session's bound, each direction

    @property
    def unsettled_out(self) -> Held: ...

    def flow_frame(self, link: Link | None = None, *, echo: bool = False) -> Flow: ...

    def send(
        self,
        link: Link,
        payload: bytes | memoryview,
        *,
        tag: bytes,
        settled: bool,
        message_format: int,
        max_frame_size: int,
    ) -> Delivery: ...

    def forward(self, link: Link, size: int, max_frame_size: int) -> int | None: ...

    def settle(self, delivery: Delivery, state: DeliveryState | None, settled: bool) -> None: ...

    def flush_dispositions(self) -> None: ...

    def send_room(self, link: Link, credit: int) -> int: ...

    def reopen_window(self) -> Flow | None: ...


Forward = Callable[[bytearray], bool]
"""A relay's pass-through on a receiving link (``Link.forward``): it sends the payload of a
whole pre-settled message on at once, or says False and does nothing (the message then arrives
as usual). A message it took is never a ``Delivery`` or an event (``Session.pass_through``)."""


class LinkError(Exception):
    """A rule broken on one link: the link is detached with ``condition``, the rest lives on."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


@attrs.define(eq=False)
class Delivery:
    """One message on one link, from its first transfer until both ends have settled it."""

    link: Link
    delivery_id: int
    tag: bytes
    settled: bool = False  # settled by us
    message_format: int = 0
    state: DeliveryState | None = None  # the outcome we declared
    remote_state: DeliveryState | None = None
    remote_settled: bool = False
    aborted: bool = False


@attrs.define(eq=False)
class Link:
    """Our end of a link. Fields named ``remote_*`` are what the peer's attach said."""

    session: LinkSession
    name: str
    handle: int
    role: bool
    state: LinkState
    source: Source | None = None
    target: Target | None = None
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    properties: Fields | None = None
    max_message_size: int | None = None  # the limit we enforce on incoming messages
    offered_capabilities: list[Symbol] | None = None
    desired_capabilities: list[Symbol] | None = None
    remote_attach: Attach | None = None
    detach_error: Error | None = None  # our own detach's error, reported with LinkDetached
    remote_handle: int | None = None
    # flow state (§2.6.7), both roles keep the same names
    delivery_count: int = 0
    link_credit: int = 0
    available: int = 0
    drain: bool = False
    # deliveries on this link in the session's unsettled tables (ours or the peer's)
    unsettled: int = 0
    max_unsettled: int = MAX_UNSETTLED
    # receiver side reassembly of a multi-frame delivery
    _partial: Delivery | None = None
    _partial_buf: bytearray = attrs.field(factory=bytearray)
    _next_tag: int = 0
    user_data: Any = None  # the layer above's (a mailbox, a future...): never read here, and
    # read back there as the type it stored, which the sans-IO core cannot name
    forward: Forward | None = None  # as receiver: a relay's pass-through (Session.pass_through)
    reported_in: int | None = None  # the input batch in which a message was last reported

    @property
    def is_sender(self) -> bool:
        return self.role is ROLE_SENDER

    @property
    def is_receiver(self) -> bool:
        return self.role is ROLE_RECEIVER

    @property
    def remote_source(self) -> Source | None:
        return self.remote_attach.source if self.remote_attach else None

    @property
    def remote_target(self) -> Target | None:
        return self.remote_attach.target if self.remote_attach else None

    @property
    def remote_properties(self) -> Fields | None:
        return self.remote_attach.properties if self.remote_attach else None

    @property
    def remote_max_message_size(self) -> int | None:
        """The largest message the peer takes on this link (0 or absent: no limit)."""
        if self.remote_attach is None or not self.remote_attach.max_message_size:
            return None
        return int(self.remote_attach.max_message_size)

    @property
    def usable_credit(self) -> int:
        """As sender: how many unsettled deliveries we may send now, the credit the peer gave
        as far as ``max_unsettled`` allows, and the session's bound (pre-settled ones need
        only the credit)."""
        credit = self.link_credit
        room = self.max_unsettled - self.unsettled
        if room < credit:
            credit = room
        if credit <= 0:  # (no min/max calls: asked on every send)
            return 0
        session = self.session
        if session.max_unsettled - session.unsettled_out.held >= credit:
            return credit  # (the session's room, read here: asked on every send)
        return session.send_room(self, credit)

    @property
    def send_blocked(self) -> bool:
        """As sender: no unsettled delivery may go out until a ``LinkFlow`` brings credit or a
        ``DeliveryUpdated`` settles one of ours."""
        return self.usable_credit <= 0

    @property
    def arriving(self) -> Delivery | None:
        """As receiver: the delivery whose first frames came and whose last has not."""
        return self._partial

    def attach_frame(self, source: Source | None, target: Target | None) -> Attach:
        """Our attach for this link, with the termini given (null ones refuse the link)."""
        return Attach(
            name=self.name,
            handle=self.handle,
            role=self.role,
            snd_settle_mode=self.snd_settle_mode,
            rcv_settle_mode=self.rcv_settle_mode,
            source=source,
            target=target,
            initial_delivery_count=self.delivery_count if self.is_sender else None,
            max_message_size=self.max_message_size if self.is_receiver else None,
            offered_capabilities=self.offered_capabilities,
            desired_capabilities=self.desired_capabilities,
            properties=self.properties,
        )

    def next_tag(self) -> bytes:
        tag = self._next_tag.to_bytes(8, "big").lstrip(b"\0") or b"\0"
        self._next_tag += 1
        return tag

    # -- sender side -----------------------------------------------------------------------

    def apply_remote_flow(self, delivery_count: int | None, link_credit: int) -> None:
        """Recompute our credit from the receiver's view (§2.6.7 'link-credit_snd').

        delivery-count_rcv + link-credit_rcv - delivery-count_snd, with the two counts
        subtracted as serial numbers (the deliveries still in flight to the receiver) and the
        credit kept a uint: 2**31 and more is credit, not a negative distance."""
        if self.is_sender:
            base = self.delivery_count if delivery_count is None else delivery_count
            in_flight = serial_diff(self.delivery_count, base)
            self.link_credit = min(max(0, link_credit - in_flight), UINT_MAX)
        else:
            # a sender's flow tells the receiver how far its delivery-count has advanced (a
            # drain): ours follows it (we have had every transfer sent before the flow), by
            # the distance mod 2**32, which a drain of 2**31 or more credit does not exceed
            if delivery_count is not None:
                advanced = (delivery_count - self.delivery_count) & SERIAL_MASK
                self.link_credit = max(0, self.link_credit - advanced)
                self.delivery_count = delivery_count

    def consume_credit(self) -> None:
        """One delivery sent: credit may go below what we were granted only when pipelining."""
        self.delivery_count = (self.delivery_count + 1) & SERIAL_MASK
        if self.link_credit > 0:
            self.link_credit -= 1

    def drain_credit(self) -> None:
        """Sender answered a drain: spend all remaining credit by advancing delivery-count."""
        self.delivery_count = serial_add(self.delivery_count, self.link_credit)
        self.link_credit = 0

    # -- receiver side ---------------------------------------------------------------------

    def receive_transfer(
        self, transfer: Transfer, payload: memoryview, delivery_id: int | None
    ) -> tuple[Delivery, bytes] | None:
        """Take one transfer frame; return the delivery and its payload once the last is in.

        ``delivery_id`` is the session-resolved id (continuations may omit it on the wire).
        Raises ``LinkError`` for link-level breaches and ``RemoteProtocolError`` for ones the
        spec treats as fatal to the connection.
        """
        partial = self._partial
        if partial is None:
            if delivery_id is None or transfer.delivery_tag is None:
                raise errors.RemoteProtocolError(
                    errors.INVALID_FIELD, "first transfer of a delivery lacks id or tag"
                )
            if len(transfer.delivery_tag) > MAX_DELIVERY_TAG:
                raise errors.RemoteProtocolError(
                    errors.INVALID_FIELD,
                    f"delivery-tag of {len(transfer.delivery_tag)} bytes (at most 32)",
                )
            if self.link_credit <= 0:
                raise LinkError(errors.TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
            if not transfer.settled and self.unsettled >= self.max_unsettled:
                raise LinkError(
                    errors.RESOURCE_LIMIT_EXCEEDED,
                    f"{self.unsettled} unsettled deliveries on {self.name!r} "
                    f"(at most {self.max_unsettled}): settle some before sending more",
                )
            self.link_credit -= 1
            self.delivery_count = (self.delivery_count + 1) & SERIAL_MASK
            settled = bool(transfer.settled)
            # link, delivery_id, tag, settled, message_format, state, remote_state and
            # remote_settled (positional: once per message)
            tag = bytes(transfer.delivery_tag)
            fmt = transfer.message_format or 0
            partial = Delivery(self, delivery_id, tag, settled, fmt, None, transfer.state, settled)
        elif delivery_id is not None and delivery_id != partial.delivery_id:
            raise errors.RemoteProtocolError(
                errors.INVALID_FIELD, "continuation transfer names another delivery-id"
            )
        else:
            if transfer.settled:
                partial.settled = partial.remote_settled = True
            if transfer.state is not None:
                partial.remote_state = transfer.state
        if transfer.aborted:
            self.discard_partial()
            return None
        buf = self._partial_buf
        size = len(buf) + len(payload)
        limit = self.max_message_size
        if limit and size > limit:
            self.discard_partial()
            raise LinkError(
                errors.MESSAGE_SIZE_EXCEEDED, f"message of over {limit} bytes on {self.name!r}"
            )
        if transfer.more:
            incoming = self.session.incoming
            if incoming.held + len(payload) > incoming.limit:
                self.discard_partial()
                raise LinkError(
                    errors.RESOURCE_LIMIT_EXCEEDED,
                    f"incomplete messages on this connection would pass {incoming.limit} bytes",
                )
            self._partial = partial
            buf += payload  # one growing buffer: no per-frame object a tiny frame could inflate
            incoming.held += len(payload)
            return None
        self._partial = None  # complete: the link holds nothing of it any more
        if not buf:  # the usual one-frame message: no earlier frames to release
            return partial, bytes(payload)
        self.discard_partial()
        buf += payload
        return partial, bytes(buf)

    def discard_partial(self) -> None:
        """Drop the delivery still arriving (aborted, refused, or its link gone)."""
        self.session.incoming.held -= len(self._partial_buf)
        self._partial = None
        self._partial_buf = bytearray()
