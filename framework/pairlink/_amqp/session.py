"""Session endpoint state (Part 2 §2.5): channels, transfer windows, delivery ids, dispositions.

The session numbers every transfer frame (next-outgoing-id / next-incoming-id), keeps both
windows of §2.5.6, allocates delivery ids shared by its links, and remembers unsettled
deliveries both ways so dispositions (ranges included) can find them (unsettled.py), counting
them per link (``Link.unsettled``) so each link's bound holds, and bounding them per session
too (``max_unsettled``): the peer's by our incoming window, ours by the credit our links may
use. Frames go out through the ``write`` callable the connection hands in; the session never
sees bytes.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from . import errors
from .codec import encode
from .link import (
    MAX_DELIVERY_TAG,
    MAX_INCOMPLETE_BYTES,
    SERIAL_MASK,
    Delivery,
    IncomingBytes,
    Link,
    LinkState,
    serial_add,
    serial_diff,
)
from .messaging import Received
from .performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Begin,
    Disposition,
    Flow,
    Performative,
    Transfer,
)
from .unsettled import Unsettled

if TYPE_CHECKING:
    from .messaging import DeliveryState

WriteFrame = Callable[[Performative, bytes | memoryview], None]

PIPELINE_WINDOW = 16
"""Transfer frames we send before the peer's begin tells us its incoming window (LP-10)."""

HANDLE_MAX = 1023
"""Default highest link handle we accept on a session (``ConnectionConfig.handle_max``): 1,024
links per session, each holding its bounded partial message and unsettled deliveries."""

# Fixed part of a transfer frame besides the performative's own encoding: the frame header.
FRAME_HEADER_SIZE = 8
MAX_SESSION_UNSETTLED = 16384
"""Default bound on the unsettled deliveries of one session, each direction
(``ConnectionConfig.max_session_unsettled``): four links at their own bound (``MAX_UNSETTLED``),
about 3 MiB, and far above what pairlink peers leave unsettled (a call's reply is settled as
it arrives). The peer's are held back by our incoming window, which never lets more frames
come than there is room for (a peer that sends past it breaks the window, and the connection
closes with ``amqp:session:window-violation``); ours by our links' usable credit: a sender of
ours waits until the peer settles some (``Session.starved`` are woken then)."""

TRANSFER_BOUND = 34
"""The most bytes a first transfer's performative can take besides its tag's: descriptor 3,
list header 9, handle, delivery-id, message-format and the tag's header 5 each, settled and
more 1 each. A message that fits with this much room is sent in one frame without encoding
the performative once more just to measure it (which cost a tenth of a reply's send)."""


class SessionState(enum.Enum):
    BEGIN_SENT = "begin-sent"
    BEGIN_RECEIVED = "begin-received"
    MAPPED = "mapped"
    END_SENT = "end-sent"
    ENDED = "ended"


@attrs.define(eq=False)
class Session:
    """Our end of one session. ``remote_*`` fields come from the peer's begin and flows."""

    channel: int
    write: WriteFrame = attrs.field(repr=False)
    state: SessionState
    incoming_window_size: int = 65536
    handle_max: int = HANDLE_MAX
    max_unsettled: int = MAX_SESSION_UNSETTLED  # each direction, all links
    remote_channel: int | None = None
    next_outgoing_id: int = 0
    outgoing_window: int = 2**31 - 1
    incoming_window: int = 0
    next_incoming_id: int | None = None
    remote_incoming_window: int = PIPELINE_WINDOW
    remote_outgoing_window: int = 0
    remote_handle_max: int = 2**32 - 1
    next_delivery_id: int = 0
    links: dict[int, Link] = attrs.field(factory=dict)  # by our handle
    remote_links: dict[int, Link] = attrs.field(factory=dict)  # by the peer's handle
    names: dict[tuple[str, bool], Link] = attrs.field(factory=dict)  # (name, our role)
    unsettled_out: Unsettled = attrs.field(factory=Unsettled)
    unsettled_in: Unsettled = attrs.field(factory=Unsettled)
    # sender links whose credit the session's bound cut to nothing: woken (LinkFlow) once
    # the peer settles some of ours
    starved: set[Link] = attrs.field(factory=set)
    incoming: IncomingBytes = attrs.field(factory=lambda: IncomingBytes(MAX_INCOMPLETE_BYTES))
    _blocked: deque[tuple[Transfer, bytes | memoryview]] = attrs.field(factory=deque)
    blocked_bytes: int = 0  # payload bytes in ``_blocked``: written once the peer's window opens
    _pending_dispositions: list[tuple[bool, int, bool, DeliveryState | None]] = attrs.field(
        factory=list
    )
    next_incoming_delivery: int | None = None  # the id the peer's next delivery must carry
    # a flow refills our incoming window once it is down to half the most it can be
    _refill_at: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self.incoming_window = self._window_to_grant()
        self._refill_at = min(self.incoming_window_size, self.max_unsettled) // 2

    # -- begin / end -----------------------------------------------------------------------

    def begin_frame(self) -> Begin:
        return Begin(
            remote_channel=self.remote_channel,
            next_outgoing_id=self.next_outgoing_id,
            incoming_window=self.incoming_window,
            outgoing_window=self.outgoing_window,
            handle_max=self.handle_max,
        )

    def on_begin(self, begin: Begin) -> None:
        self.next_incoming_id = begin.next_outgoing_id
        self.remote_outgoing_window = begin.outgoing_window
        self.remote_handle_max = begin.handle_max
        # the peer counts our frames from our initial next-outgoing-id (0), some may be in flight
        self.remote_incoming_window = max(
            0, begin.incoming_window - serial_diff(self.next_outgoing_id, 0)
        )
        self.state = SessionState.MAPPED
        self._unblock()

    # -- handles ---------------------------------------------------------------------------

    def free_handle(self) -> int | None:
        """The lowest handle free for a link of ours: within our handle-max and the peer's,
        since the peer MUST NOT be sent a handle above its own (§2.7.2); None if none is."""
        for handle in range(min(self.handle_max, self.remote_handle_max) + 1):
            if handle not in self.links:
                return handle
        return None

    def add_link(self, link: Link) -> None:
        self.links[link.handle] = link
        self.names[(link.name, link.role)] = link

    def forget_link(self, link: Link) -> None:
        """Drop a fully detached link; its unsettled deliveries die with it."""
        link.state = LinkState.DETACHED
        self.links.pop(link.handle, None)
        if link.remote_handle is not None:
            self.remote_links.pop(link.remote_handle, None)
        if self.names.get((link.name, link.role)) is link:
            del self.names[(link.name, link.role)]
        link.discard_partial()
        if link.unsettled:  # (skipping the scan keeps detaching settled links O(1))
            self.unsettled_in.drop_link(link)
            self.unsettled_out.drop_link(link)
            link.unsettled = 0
        self.starved.discard(link)

    def on_attach(self, attach: Attach, max_unsettled: int) -> tuple[Link, bool] | None:
        """Take the peer's attach: the link it answers, or the one it starts (then True: the
        user must answer it), or None when it answers a link we detached meanwhile."""
        handle = attach.handle
        if handle in self.remote_links:
            raise errors.RemoteProtocolError(errors.HANDLE_IN_USE, f"handle {handle} is in use")
        if handle > self.handle_max:  # §2.7.2: a framing error
            raise errors.RemoteProtocolError(
                errors.FRAMING_ERROR, f"handle {handle} is above our handle-max {self.handle_max}"
            )
        our_role = not attach.role
        link = self.names.get((attach.name, our_role))
        if link is not None and link.state is LinkState.DETACH_SENT and link.remote_attach is None:
            # we detached before the peer's answer came: the frames crossed, which is legal;
            # its detach follows and ends the link
            link.remote_attach = attach
            link.remote_handle = handle
            self.remote_links[handle] = link
            return None
        if link is not None and link.state is not LinkState.ATTACH_SENT:
            raise errors.RemoteProtocolError(
                errors.ILLEGAL_STATE, f"link {attach.name!r} is already attached"
            )
        if attach.role is ROLE_SENDER and attach.initial_delivery_count is None:
            raise errors.RemoteProtocolError(
                errors.INVALID_FIELD, "a sender's attach lacks initial-delivery-count"
            )
        requested = link is None
        if link is None:
            ours = self.free_handle()
            if ours is None:  # one handle each side per link: no more links than that
                raise errors.RemoteProtocolError(
                    errors.NOT_ALLOWED,
                    f"attach {attach.name!r}: more links on this session than handle-max "
                    f"{min(self.handle_max, self.remote_handle_max)} allows",
                )
            link = Link(self, attach.name, ours, our_role, LinkState.ATTACH_RECEIVED,
                        max_unsettled=max_unsettled)  # fmt: skip
            self.add_link(link)
        else:
            link.state = LinkState.ATTACHED
        link.remote_attach = attach
        link.remote_handle = handle
        self.remote_links[handle] = link
        if attach.initial_delivery_count is not None and link.is_receiver:
            link.delivery_count = attach.initial_delivery_count
        return link, requested

    def remote_link(self, handle: int) -> Link:
        link = self.remote_links.get(handle)
        if link is None:
            raise errors.RemoteProtocolError(
                errors.UNATTACHED_HANDLE, f"handle {handle} is not attached"
            )
        return link

    # -- flow ------------------------------------------------------------------------------

    def flow_frame(self, link: Link | None = None, *, echo: bool = False) -> Flow:
        """Our session state, plus one link's, as a flow frame; refills our incoming window."""
        self.incoming_window = self._window_to_grant()
        flow = Flow(
            next_incoming_id=self.next_incoming_id,
            incoming_window=self.incoming_window,
            next_outgoing_id=self.next_outgoing_id,
            outgoing_window=self.outgoing_window,
            echo=echo,
        )
        if link is not None:
            flow.handle = link.handle
            flow.delivery_count = link.delivery_count
            flow.link_credit = link.link_credit
            flow.available = link.available
            flow.drain = link.drain
        return flow

    def on_flow(self, flow: Flow) -> Link | None:
        """Take the peer's flow; returns the link it names, if any (state already applied)."""
        next_incoming = 0 if flow.next_incoming_id is None else flow.next_incoming_id
        # next-incoming-id_rcv + incoming-window_rcv - next-outgoing-id_snd: the ids differ
        # as serial numbers (our frames in flight), the window is a uint (2**31+ is no debt)
        in_flight = serial_diff(self.next_outgoing_id, next_incoming)
        self.remote_incoming_window = max(0, flow.incoming_window - in_flight)
        self.remote_outgoing_window = flow.outgoing_window
        link = None
        if flow.handle is not None:
            link = self.remote_link(flow.handle)
            if link.state is not LinkState.DETACH_SENT:
                link.apply_remote_flow(flow.delivery_count, flow.link_credit or 0)
                link.drain = bool(flow.drain)
                if flow.available is not None:
                    link.available = flow.available
        self._unblock()
        return link

    def wants_window_refill(self) -> bool:
        """Whether a flow should reopen our incoming window: half of the most it can be is
        used, and there is room for more unsettled deliveries than it now allows."""
        window = self.incoming_window
        return window <= self._refill_at and self._window_to_grant() > window

    def reopen_window(self) -> Flow | None:
        """A flow reopening our incoming window, if our settles have made room under
        ``max_unsettled`` for more frames than it allows (else the peer would wait forever:
        a window is reopened only as frames come)."""
        if self.state is SessionState.MAPPED and self.wants_window_refill():
            return self.flow_frame()
        return None

    def _window_to_grant(self) -> int:
        """Our incoming window: its size, or fewer frames if fewer unsettled deliveries may
        come (each takes at least a frame), so the peer cannot pass ``max_unsettled``."""
        room = self.max_unsettled - self.unsettled_in.held
        size = self.incoming_window_size
        return size if room >= size else max(room, 0)

    def send_room(self, link: Link, credit: int) -> int:
        """``credit`` as far as this session's bound on our unsettled deliveries allows; a link
        it cuts to nothing is ``starved`` until the peer settles some (``Link.usable_credit``)."""
        room = self.max_unsettled - self.unsettled_out.held
        if room >= credit:
            return credit
        if room <= 0:
            self.starved.add(link)
            return 0
        return room

    def wake_starved(self) -> list[Link]:
        """The starved links, once the peer has settled enough of ours to give them room."""
        if not self.starved or self.unsettled_out.held >= self.max_unsettled:
            return []
        links = [link for link in self.starved if link.state is LinkState.ATTACHED]
        self.starved.clear()
        return links

    # -- outgoing transfers ----------------------------------------------------------------

    def send(
        self,
        link: Link,
        payload: bytes | memoryview,
        *,
        tag: bytes,
        settled: bool,
        message_format: int,
        max_frame_size: int,
    ) -> Delivery:
        if not settled and self.unsettled_out.held >= self.max_unsettled:
            raise errors.LocalProtocolError(
                errors.RESOURCE_LIMIT_EXCEEDED,
                f"{self.unsettled_out.held} deliveries on this session wait for the peer to "
                f"settle them (max_session_unsettled {self.max_unsettled}): wait until "
                f"link.send_blocked is False",
            )
        delivery = Delivery(link, self.next_delivery_id, tag, settled, message_format)
        self.next_delivery_id = (self.next_delivery_id + 1) & SERIAL_MASK
        link.consume_credit()
        if not settled:
            self.unsettled_out.add(delivery)
            link.unsettled += 1
        # handle, delivery-id, delivery-tag, message-format, settled (positional: per message)
        first = Transfer(link.handle, delivery.delivery_id, tag, message_format, settled)
        if len(payload) + len(tag) + TRANSFER_BOUND <= max_frame_size - FRAME_HEADER_SIZE:
            self._queue_transfer(first, payload)  # one frame, whatever the exact overhead
            return delivery
        view = memoryview(payload)
        first.more = True  # measured with 'more' set: the split case must fit too
        room = max_frame_size - FRAME_HEADER_SIZE - _transfer_overhead(first)
        if len(view) <= room:
            first.more = False
            self._queue_transfer(first, view)
            return delivery
        self._queue_transfer(first, view[:room])
        offset = room
        while offset < len(view):
            chunk = view[offset : offset + room]
            offset += room
            more = offset < len(view)
            self._queue_transfer(Transfer(handle=link.handle, more=more), chunk)
        return delivery

    def forward(self, link: Link, size: int, max_frame_size: int) -> int | None:
        """Number a pre-settled delivery of ``size`` bytes on ``link`` whose one frame the
        caller writes at once (a relay's pass-through, ``Connection.forward``): its
        delivery-id; None, and nothing done, while our window is closed or frames wait, or
        when it might not fit one frame with the longest tag."""
        if self._blocked or self.remote_incoming_window <= 0:
            return None
        if size + MAX_DELIVERY_TAG + TRANSFER_BOUND > max_frame_size - FRAME_HEADER_SIZE:
            return None
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) & SERIAL_MASK
        self.next_outgoing_id = (self.next_outgoing_id + 1) & SERIAL_MASK
        self.remote_incoming_window -= 1
        link.consume_credit()
        return delivery_id

    def _queue_transfer(self, transfer: Transfer, chunk: bytes | memoryview) -> None:
        if self._blocked or self.remote_incoming_window <= 0:
            self._blocked.append((transfer, chunk))
            self.blocked_bytes += len(chunk)
            return
        self._write_transfer(transfer, chunk)

    def _write_transfer(self, transfer: Transfer, chunk: bytes | memoryview) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + 1) & SERIAL_MASK
        self.remote_incoming_window -= 1
        self.write(transfer, chunk)

    def _unblock(self) -> None:
        while self._blocked and self.remote_incoming_window > 0:
            transfer, chunk = self._blocked.popleft()
            self.blocked_bytes -= len(chunk)
            self._write_transfer(transfer, chunk)

    # -- incoming transfers ----------------------------------------------------------------

    def pass_through(self, handle: int, delivery_id: int, payload: bytearray, batch: int) -> bool:
        """A whole pre-settled message of format 0, in one frame on ``handle``: hand it to its
        link's ``forward`` (a relay) and count it as ``on_transfer`` would, if it would take
        the frame as it is (window, delivery-id, credit, size) and no message of the link was
        reported in this ``batch`` of input (``Link.reported_in``: none overtakes another).
        False: nothing was done, ``on_transfer`` is to judge the frame."""
        link = self.remote_links.get(handle)
        if link is None:
            return False
        forward = link.forward
        expected = self.next_incoming_delivery
        limit = link.max_message_size
        if (
            forward is None
            or link.reported_in == batch
            or self.incoming_window <= 0
            or link.role is not ROLE_RECEIVER
            or link.state is not LinkState.ATTACHED
            or link.arriving is not None
            or (expected is not None and delivery_id != expected)
            or link.link_credit <= 0
            or (limit and len(payload) > limit)
            or not forward(payload)
        ):
            return False
        self.incoming_window -= 1
        if self.next_incoming_id is not None:
            self.next_incoming_id = (self.next_incoming_id + 1) & SERIAL_MASK
        self.next_incoming_delivery = (delivery_id + 1) & SERIAL_MASK
        link.link_credit -= 1  # (as receive_transfer counts a delivery)
        link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
        return True

    def on_transfer(
        self, transfer: Transfer, payload: memoryview
    ) -> tuple[Link, tuple[Delivery, bytes] | None]:
        """Count the frame against our window, then hand it to its link for reassembly."""
        link = self.remote_links.get(transfer.handle) or self.remote_link(transfer.handle)
        if self.incoming_window <= 0:
            raise errors.RemoteProtocolError(
                errors.WINDOW_VIOLATION, "transfer beyond the session's incoming window"
            )
        self.incoming_window -= 1
        if self.next_incoming_id is not None:
            self.next_incoming_id = (self.next_incoming_id + 1) & SERIAL_MASK
        if link.role is not ROLE_RECEIVER:
            raise errors.RemoteProtocolError(
                errors.ILLEGAL_STATE, f"transfer on {link.name!r}, where the peer is receiver"
            )
        delivery_id = transfer.delivery_id
        if link.state is LinkState.DETACH_SENT:
            # frames still in flight on a link we detached are dropped, but their delivery ids
            # count: the peer numbers its deliveries per session, whatever became of the link
            if delivery_id is not None:
                self.next_incoming_delivery = serial_add(delivery_id, 1)
            return link, None
        arriving = link.arriving
        if arriving is not None:  # a continuation: deliveries on other links may interleave,
            if delivery_id is None:  # so the link, not the session, knows which one it is
                delivery_id = arriving.delivery_id
        elif delivery_id is not None:  # a new delivery: ids follow each other on the session
            expected = self.next_incoming_delivery
            if expected is not None and delivery_id != expected:
                raise errors.RemoteProtocolError(
                    errors.INVALID_FIELD, f"delivery-id {delivery_id}, expected {expected}"
                )
            self.next_incoming_delivery = (delivery_id + 1) & SERIAL_MASK
        done = link.receive_transfer(transfer, payload, delivery_id)
        if done is not None and not done[0].remote_settled:
            self.unsettled_in.add(done[0])
            link.unsettled += 1
        return link, done

    # -- dispositions ----------------------------------------------------------------------

    def settle(self, delivery: Delivery, state: DeliveryState | None, settled: bool) -> None:
        """Declare an outcome for a delivery; frames coalesce into ranges at ``flush``."""
        delivery.state = state
        if settled:
            delivery.settled = True
            table = self.unsettled_in if delivery.link.is_receiver else self.unsettled_out
            if table.discard(delivery):
                delivery.link.unsettled -= 1
        role = delivery.link.role
        self._pending_dispositions.append((role, delivery.delivery_id, settled, state))

    def flush_dispositions(self) -> None:
        """Write queued dispositions, one frame per run of consecutive ids with one outcome."""
        pending = self._pending_dispositions
        if not pending:
            return
        self._pending_dispositions = []
        pending.sort(key=lambda p: (p[0], p[1]))
        run_role, first, settled, state = pending[0]
        last = first
        for role, delivery_id, d_settled, d_state in pending[1:]:
            if (
                role == run_role
                and delivery_id == (last + 1) & SERIAL_MASK
                and d_settled == settled
                and d_state == state
            ):
                last = delivery_id
                continue
            self._write_disposition(run_role, first, last, settled, state)
            run_role, first, last, settled, state = (
                role,
                delivery_id,
                delivery_id,
                d_settled,
                d_state,
            )
        self._write_disposition(run_role, first, last, settled, state)

    def _write_disposition(
        self, role: bool, first: int, last: int, settled: bool, state: DeliveryState | None
    ) -> None:
        self.write(
            Disposition(
                role=role,
                first=first,
                last=None if last == first else last,
                settled=settled,
                state=state,
            ),
            b"",
        )

    def on_disposition(self, disposition: Disposition) -> list[Delivery]:
        """Apply the peer's disposition to the deliveries it names; returns those changed.

        The work is O(log n + k), k the deliveries it changes, whatever the range's width or
        the table's size, and each delivery is changed at most twice by the peer, so no frame
        can cost more than the deliveries it was sent for (unsettled.py): a settling one
        removes what it settles; one that only declares an outcome (rcv-settle-mode second)
        changes only the deliveries without one yet, as an outcome is terminal (§3.4), so its
        repeat over the same ids visits none of them. A non-settling one with no state or a
        received state (how far a delivery got, for resuming links, which pairlink does not
        do) changes nothing and costs nothing."""
        # role is the peer's role: a receiver's disposition is about deliveries we sent
        table = self.unsettled_out if disposition.role is ROLE_RECEIVER else self.unsettled_in
        first = disposition.first
        last = disposition.last
        span = 0 if last is None else serial_diff(last, first)
        if span < 0:
            raise errors.RemoteProtocolError(errors.INVALID_FIELD, "disposition last < first")
        state = disposition.state
        if disposition.settled:
            if span == 0:  # the usual one-id disposition: found by id
                delivery = table.get(first)
                changed = [delivery] if delivery is not None and table.discard(delivery) else []
            else:
                changed = table.settle_range(first, span)
            for delivery in changed:
                if state is not None:
                    delivery.remote_state = state
                delivery.remote_settled = True
                delivery.link.unsettled -= 1
            return changed
        if state is None or isinstance(state, Received):
            return []
        if span == 0:
            delivery = table.get(first)
            changed = [delivery] if delivery is not None and table.decide(delivery) else []
        else:
            changed = table.decide_range(first, span)
        for delivery in changed:
            delivery.remote_state = state
        return changed

    def forget_all_links(self) -> list[Link]:
        """The session is gone: every link goes with it. Returns the links that were live."""
        links = list(self.links.values())
        for link in links:
            self.forget_link(link)
        return links


def _transfer_overhead(transfer: Transfer) -> int:
    """Bytes the performative of a first transfer takes (continuations are never larger)."""
    return len(encode(transfer))
