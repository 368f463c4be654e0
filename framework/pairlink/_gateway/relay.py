"""Relaying messages across a gateway: one direction at a time, credit, outcomes and detaches
carried end to end.

A :class:`Hop` joins a link we receive on (``inbound``) to a link we send on (``outbound``):

* credit: ``inbound`` is granted exactly the credit ``outbound`` has, less what waits here, so a
  slow service slows its callers through any number of gateways and a gateway holds at most
  what it granted (messages only wait when the next hop took credit back);
* bytes: a message is forwarded as it came; only its header changes, when it waited here long
  enough (≥ 1 ms) to cut its ``ttl`` (the bare message is immutable, Part 3 §3.2). One that
  need not wait, pre-settled and in one frame, passes straight through (``pass_on``): its
  transfer alone is read, and no delivery or event is made of it;
* outcomes: an unsettled message is settled on ``inbound`` with the outcome ``outbound``'s
  receiver gave it, never before, so nothing is acknowledged early;
* endings: when ``outbound`` goes, what it still owed is released (never forwarded) or
  ``modified(delivery-failed)`` (forwarded, fate unknown) on ``inbound``.

A pair relayed across a gateway is two hops (requests one way, replies the other); the ends
themselves are link ends (:class:`pairlink._io.links.LinkEnd`) owned by the pair or routing
node, which hears their events.
"""

from __future__ import annotations

from collections import deque

import attrs
import trio

from pairlink._amqp.errors import DecodeError
from pairlink._amqp.link import Delivery
from pairlink._amqp.messaging import DeliveryState, Modified, Released, with_ttl_reduced
from pairlink._io.links import LinkEnd
from pairlink._telemetry.logs import get_logger
from pairlink.errors import PairlinkError

log = get_logger("pairlink.gateway")


@attrs.define
class _Waiting:
    delivery: Delivery
    payload: bytes
    since: float


class Hop:
    """Messages from ``inbound`` to ``outbound`` (see the module docstring)."""

    def __init__(self, inbound: LinkEnd | None = None, outbound: LinkEnd | None = None) -> None:
        self.inbound = inbound
        self.outbound = outbound
        self.waiting: deque[_Waiting] = deque()
        self.forwarded: dict[Delivery, Delivery] = {}  # outbound delivery -> inbound delivery

    # -- credit ----------------------------------------------------------------------------

    def outbound_credit(self) -> int:
        out = self.outbound
        return out.link.usable_credit if out is not None and out.usable else 0

    def mirror_credit(self, credit: int | None = None) -> None:
        """Grant ``inbound`` what ``outbound`` may take (or ``credit``), less what waits.
        Credit it should no longer have is taken back with a drain, never by lowering it: a
        transfer already on its way under the old credit would be refused (the container
        takes credit back the same way); what such transfers bring waits here, as granted."""
        inbound = self.inbound
        if inbound is None or not inbound.usable:
            return
        want = self.outbound_credit() if credit is None else credit
        want = max(0, want - len(self.waiting))
        have = inbound.link.link_credit
        if want > have:
            inbound.conn.flow(inbound.link, want)
        elif want < have and not inbound.link.drain:  # one drain at a time
            inbound.conn.flow(inbound.link, have, drain=True)

    def answer_drain(self) -> None:
        """``outbound``'s receiver asked to drain and nothing waits here to use its credit:
        say so (Part 2 §2.6.7); ``mirror_credit`` then takes the credit back upstream."""
        out = self.outbound
        if out is not None and out.usable and out.link.drain and not self.waiting:
            out.conn.complete_drain(out.link)

    # -- messages --------------------------------------------------------------------------

    def arrive(self, delivery: Delivery, payload: bytes) -> None:
        if self.waiting or self.outbound_credit() <= 0:
            self.waiting.append(_Waiting(delivery, payload, trio.current_time()))
            return
        self._forward(delivery, payload, 0.0)

    def pass_on(self, payload: bytearray) -> bool:
        """``inbound``'s ``Link.forward``: a plain pre-settled message goes on to ``outbound``
        as it came, from the engine that read it, with no delivery or event
        (``AmqpConnection.pass_through``); False (it then ``arrive``s as usual) while anything
        waits here or when ``outbound`` cannot send it at once."""
        out = self.outbound
        if self.waiting or out is None or out.ended:
            return False
        return out.conn.forward(out.link, payload)

    def pump(self) -> None:
        """Forward what waits, as far as ``outbound``'s credit goes."""
        now = trio.current_time()
        while self.waiting and self.outbound_credit() > 0:
            item = self.waiting.popleft()
            self._forward(item.delivery, item.payload, now - item.since)

    def _forward(self, delivery: Delivery, payload: bytes, waited: float) -> None:
        out = self.outbound
        assert out is not None
        try:
            payload = with_ttl_reduced(payload, int(waited * 1000))
            sent = out.conn.send(out.link, payload, settled=delivery.settled)
        except (DecodeError, PairlinkError) as exc:
            log.warning("relay.unforwardable", conn=out.conn.id, link=out.link.name, error=str(exc))
            self._settle_inbound(delivery, Modified(delivery_failed=True, undeliverable_here=True))
            return
        if not delivery.settled:
            self.forwarded[sent] = delivery

    def outcome(self, sent: Delivery) -> None:
        """``outbound``'s receiver decided on ``sent``: say the same on ``inbound``."""
        if sent.remote_state is None and not sent.remote_settled:
            return
        delivery = self.forwarded.pop(sent, None)
        if delivery is None:
            return
        self._settle_inbound(delivery, sent.remote_state)
        out = self.outbound
        if out is not None and out.usable:
            out.conn.settle(sent, sent.remote_state)
            if out.link.unsettled >= out.link.max_unsettled - 1:  # that made room: use it
                self.pump()
                self.mirror_credit()

    def _settle_inbound(self, delivery: Delivery, state: DeliveryState | None) -> None:
        inbound = self.inbound
        if inbound is not None and inbound.usable:
            inbound.conn.settle(delivery, state)

    def abandon(self) -> None:
        """``outbound`` is gone: release what never left, and report what left without an
        outcome as ``modified(delivery-failed)``: it may or may not have been processed."""
        while self.waiting:
            self._settle_inbound(self.waiting.popleft().delivery, Released())
        for delivery in self.forwarded.values():
            self._settle_inbound(delivery, Modified(delivery_failed=True))
        self.forwarded.clear()
