"""A service's mailbox: its slots, the callers that share them, and the credit that promises them.

A mailbox of ``bound`` slots counts every call its service holds (queued, running, or a reply
waiting for the caller's credit) *and* every credit granted and not yet used: credit is a promise
to hold a call. Credit comes only from free slots, so the calls held never exceed the bound,
however many connections, sessions and links callers open. A link may get no credit at all.

Sharing, per connection first, then per link:

* each connection with request links (a *caller*) is entitled to an equal share of the slots
  beyond the reserve, and each of its links to an equal part of that share (at least one);
* free slots go round-robin to the callers with a link waiting for credit: first one each to
  callers that hold nothing (the reserve included), then to callers below their share, then, so
  that no slot idles while anyone waits, to the others. A caller above its share gets nothing
  new while one below it waits: a new caller is admitted as soon as a slot frees, however many
  calls and links another caller has waiting. A caller whose call ends goes behind the callers
  that waited meanwhile: with a mailbox of one, the slot takes turns;
* ``bound // RESERVE_DIVISOR`` slots go only to callers that hold nothing, one each: they let a
  new caller's pipelined first call (LP-10) find its credit while established callers use all
  the rest, and let a caller whose calls have all ended start again.

Taking credit back. A receiver may lower a link's credit with a flow, but what the sender sent
before it saw that flow still arrives (and our engine detaches a link for a transfer beyond its
credit). So credit is taken back with a *drain* (Part 2 §2.6.7): the sender sends what it has
and returns the rest by advancing its delivery-count; until its transfers or its flow say so,
the slots stay counted. A connection's link holding more than its part is drained while another
of its links waits, and so are the links of callers above their share while a caller below its
share waits. Credit is a lease: a link that has not answered its drain
``drain_timeout`` seconds later (:data:`pairlink._config.limits.DRAIN_TIMEOUT`) loses it, detached
with ``amqp:resource-limit-exceeded``, and its slots go to those waiting. So a caller that
takes credit and never uses or returns it delays the others by that long at most.

A link is topped up when its credit falls to half its part, in batches: at once for a link with
no credit left, otherwise after a quarter of the mailbox has freed up or when nothing is queued.
So a steady caller costs one flow frame per half part of calls, not one per call.

Calls that wait for a worker queue per caller and are taken round-robin: one caller's backlog
delays another's call by one turn of each caller at most, not by the backlog.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio

from pairlink._amqp.errors import RESOURCE_LIMIT_EXCEEDED
from pairlink._amqp.link import Link, serial_diff
from pairlink._amqp.messaging import Error
from pairlink._config.limits import DRAIN_TIMEOUT
from pairlink._rpc.batch import ROWS_PER_SLOT
from pairlink._telemetry.logs import get_logger

log = get_logger("pairlink.service")

_REVOKED = (
    "credit revoked: the link did not answer a drain within {:g} s (send what you can, then "
    "give the rest of the credit back: a flow with drain)"
)

STARVED_AFTER = 10.0
"""Seconds a request link may wait for credit before the service says so: logged once
(``credit.starved``, naming who holds the most credit) and reported by ``$health``."""

RESERVE_DIVISOR = 32
"""A mailbox keeps ``bound // RESERVE_DIVISOR`` slots for callers that hold nothing (4 of the
default 128; none below 32, where one slot is too large a part to set aside): a few new callers'
pipelined first calls find credit at once even while established callers hold everything else."""


class _Stage(enum.Enum):
    """Who may take free slots, in the order they are offered."""

    NEWCOMERS = "callers holding nothing: one credit each, the reserve included"
    BELOW_SHARE = "callers below their share, up to it"
    ANYONE = "every waiting caller, from what is left beyond the reserve"


CallT = TypeVar("CallT")


class CreditedLink(Protocol):
    """A request link as the mailbox sees it (:class:`pairlink._server.container.RequestLink`):
    the mailbox counts its credit, sets it, and revokes it from a link that ignores a drain."""

    ledger: Ledger

    @property
    def usable(self) -> bool: ...
    @property
    def link(self) -> Link: ...
    def set_credit(self, credit: int) -> None: ...
    def drain(self, credit: int) -> None: ...
    def revoke(self, error: Error) -> None: ...
    def describe(self) -> str:
        """Who holds this link, for a log line or a health report."""


@attrs.define(eq=False)
class Caller(Generic[CallT]):
    """One connection's part of a mailbox."""

    conn: Hashable
    links: dict[CreditedLink, None] = attrs.field(factory=dict)  # its attached request links
    hungry: dict[CreditedLink, None] = attrs.field(factory=dict)  # those wanting credit, in turn
    queue: deque[CallT] = attrs.field(factory=deque)  # its calls waiting for a worker
    held: int = 0  # its calls in the mailbox
    running: int = 0  # those of them running now (the actor counts them)
    credit: int = 0  # credit its links hold, unused

    @property
    def use(self) -> int:
        """The slots it takes: calls held and credit promised."""
        return self.held + self.credit


@attrs.define(eq=False)
class Ledger:
    """What the mailbox counts for one request link."""

    caller: Caller[Any]
    counted: int  # the link's delivery-count when its credit was last accounted
    granted: int = 0  # credit held out on the link and not yet seen used
    draining: bool = False  # asked to send what it has or give the credit back
    drain_due: float = math.inf  # while draining: when the credit is revoked if still held


class Mailbox(Generic[CallT]):
    """The slots of one service, the credit of its request links, and its queue of calls
    (``CallT``: whatever the actor queues)."""

    def __init__(self, bound: int, drain_timeout: float = DRAIN_TIMEOUT) -> None:
        self.bound = bound
        self.drain_timeout = drain_timeout
        self.reserve = bound // RESERVE_DIVISOR
        # by connection, while it has links or calls
        self.callers: dict[Hashable, Caller[CallT]] = {}
        self.links: dict[CreditedLink, None] = {}  # every attached request link
        self.held = 0  # calls in the mailbox: queued + running + replies waiting for credit
        self.outstanding = 0  # credit granted and not yet used, over all links
        self.queued = 0
        self.peak = 0  # the most calls ever held at once
        self.closed = False  # stopping: no more credit
        self.drained = trio.Event()  # closed, and every call held has been released
        self._linked = 0  # callers with links: the share is divided among them
        self._waiting: dict[Caller[CallT], None] = {}  # callers with hungry links, in turn order
        # hungry links with no credit at all, since when (oldest first)
        self._blocked: dict[CreditedLink, float] = {}
        self._starved_since = math.inf  # the wait last reported (credit.starved)
        self._credited: dict[CreditedLink, None] = {}  # links holding credit
        self._draining: dict[CreditedLink, None] = {}  # links asked to drain, oldest first
        self.revoked = 0  # links whose credit was revoked (they ignored a drain)
        self._ready: dict[Caller[CallT], None] = {}  # callers with queued calls, in turn order
        self._batch = max(1, bound // 4)
        self._freed = 0  # slots freed since credit was last handed out
        self._grant_soon = trio.Event()

    @property
    def free(self) -> int:
        """Slots neither held by a call nor promised as credit."""
        return self.bound - self.held - self.outstanding

    @property
    def share(self) -> int:
        """What each caller is entitled to."""
        return max(1, (self.bound - self.reserve) // max(1, self._linked))

    @staticmethod
    def part(caller: Caller[Any], share: int) -> int:
        """What each link of ``caller`` is entitled to."""
        return max(1, share // max(1, len(caller.links)))

    # -- links -----------------------------------------------------------------------------

    def ledger(self, conn: Hashable, link: Link) -> Ledger:
        """The ledger of a new request link of connection ``conn``."""
        caller = self.callers.get(conn)
        if caller is None:
            caller = self.callers[conn] = Caller(conn)
        return Ledger(caller, link.delivery_count)

    def attach(self, origin: CreditedLink) -> None:
        """A new request link: its credit goes out now, before any later frame of the
        connection is read, so that a pipelined first call finds it (LP-10). Stopping, it
        gets one credit if a slot is free: its call is answered 503 rather than refused."""
        caller = origin.ledger.caller
        if not caller.links:
            self._linked += 1
        caller.links[origin] = None
        self.links[origin] = None
        if self.closed:
            if self.free > 0:
                self._give(origin, 1)
                self._flow(origin)
            return
        self._want(origin)
        self.distribute()

    def detach(self, origin: CreditedLink) -> None:
        """The link is gone (or going: nothing it sends now is read): its credit is free."""
        if origin not in self.links:
            return
        del self.links[origin]
        ledger = origin.ledger
        caller = ledger.caller
        self._freed += ledger.granted
        self._take(origin, ledger.granted)
        self._blocked.pop(origin, None)
        self._draining.pop(origin, None)
        caller.hungry.pop(origin, None)
        del caller.links[origin]
        if not caller.links:
            self._linked -= 1
            self._waiting.pop(caller, None)
            if not caller.held:
                self._forget(caller)
        if self._waiting and not self.closed:
            self._grant_soon.set()  # the slots, and a larger share for the others

    def arrived(self, origin: CreditedLink) -> None:
        """A call came on ``origin`` (one of its credits used): it holds a slot now. (On
        every call's path: kept lean.)"""
        ledger = origin.ledger
        caller = ledger.caller
        self._sync(origin)
        self.held += 1
        caller.held += 1
        if self.held > self.peak:
            self.peak = self.held
        # at or below half its part (``part(caller, share) // 2``, unfolded)
        low = (self.bound - self.reserve) // (self._linked or 1) // (len(caller.links) or 1) // 2
        if ledger.granted <= low:
            if ledger.draining and not ledger.granted:
                self._drained(origin)  # the drain is over: all of the credit was used
            self._want(origin)

    def weigh(self, rows: int) -> int:
        """A batch of ``rows`` arrived: beside its call's slot it holds one more per
        :data:`~pairlink._rpc.batch.ROWS_PER_SLOT` rows past the first slot's, so the credit
        still to come counts its rows. Returns those extra slots, for :meth:`unweigh`."""
        extra = max(0, rows - 1) // ROWS_PER_SLOT
        self.held += extra
        if self.held > self.peak:
            self.peak = self.held
        return extra

    def unweigh(self, extra: int) -> None:
        """A batch was answered: the extra slots :meth:`weigh` took are free again."""
        self.held -= extra
        self._freed += extra
        self._replenish()

    def flowed(self, origin: CreditedLink) -> None:
        """The sender's flow: answering a drain, it may have given credit back."""
        if origin not in self.links:
            return
        ledger = origin.ledger
        before = ledger.granted
        self._sync(origin)
        if ledger.granted < before:
            self._freed += before - ledger.granted
            if not ledger.granted:
                self._drained(origin)
                self._want(origin)  # at the back of its turn: it showed it had nothing to send
            elif self._waiting:
                self._replenish()

    def release(self, caller: Caller[CallT]) -> None:
        """One of ``caller``'s calls no longer holds a slot (answered, or undeliverable)."""
        self.held -= 1
        caller.held -= 1
        self._freed += 1
        if caller in self._waiting:  # it had its turn: those that waited meanwhile go first
            del self._waiting[caller]
            self._waiting[caller] = None
        if not caller.held and not caller.links:
            self._forget(caller)
        if self.closed and self.held <= 0:
            self.drained.set()
        self._replenish()

    def stop(self) -> None:
        """No more credit: every link is asked to send what it has or give its credit back
        (a drain, so that what is already on its way is still answered, with a 503)."""
        self.closed = True
        self._grant_soon.set()  # ends the granter
        if self.held <= 0:
            self.drained.set()
        for origin in list(self._credited):
            self._drain(origin)

    # -- the queue of calls ----------------------------------------------------------------

    def enqueue(self, origin: CreditedLink, call: CallT) -> None:
        """Queue ``call``, which came on ``origin``, for a worker."""
        caller = origin.ledger.caller
        caller.queue.append(call)
        self._ready.setdefault(caller, None)
        self.queued += 1

    def dequeue(self) -> CallT:
        """The next call to run: the oldest of the caller whose turn it is."""
        return self._take_from(next(iter(self._ready)))

    def dequeue_first(self, admits: Callable[[Caller[CallT]], bool]) -> CallT | None:
        """The oldest call of the first caller in turn that ``admits`` takes (None: no
        caller with queued calls does); the others keep their places."""
        for caller in self._ready:
            if admits(caller):
                return self._take_from(caller)
        return None

    def _take_from(self, caller: Caller[CallT]) -> CallT:
        call = caller.queue.popleft()
        del self._ready[caller]
        if caller.queue:
            self._ready[caller] = None  # its next call waits for the others' turns
        self.queued -= 1
        return call

    # -- handing out credit ----------------------------------------------------------------

    async def granter(self) -> None:
        """Hands out credit once per scheduler batch: every slot freed in one burst (a run of
        replies flushed by one flow frame, several workers finishing) makes one flow per link.
        Revokes the credit of links whose drain is overdue, when it falls due."""
        while not self.closed:
            with trio.move_on_at(self._next_due()):
                await self._grant_soon.wait()
            if self._grant_soon.is_set():
                self._grant_soon = trio.Event()
            now = trio.current_time()
            self._revoke_overdue(now)
            self._report_starved(now)
            self.distribute()

    def distribute(self) -> None:
        """Give the free slots to the waiting links, fairly; one flow frame per link at most.
        If some wait still, take back credit held beyond a fair part (a drain)."""
        self._freed = 0
        if self.closed or not self._waiting:
            return
        share = self.share
        grants: dict[CreditedLink, None] = {}
        self._hand_out(self.free, share, _Stage.NEWCOMERS, grants)
        spare = self.free - self.reserve
        for stage in (_Stage.BELOW_SHARE, _Stage.ANYONE):
            if spare > 0:
                spare = self._hand_out(spare, share, stage, grants)
        for origin in grants:
            self._flow(origin)
        if self._waiting:
            self._reclaim(share)

    def _hand_out(
        self, free: int, share: int, stage: _Stage, grants: dict[CreditedLink, None]
    ) -> int:
        """One round-robin pass over the waiting callers that ``stage`` admits; returns what
        is left of ``free``."""
        ring = deque(c for c in self._waiting if _admits(stage, c, share))
        while free > 0 and ring:
            caller = ring.popleft()
            origin = self._next_hungry(caller, share)
            if origin is None:
                continue
            ledger = origin.ledger
            part = self.part(caller, share)
            give = 1 if stage is _Stage.NEWCOMERS else part - ledger.granted
            if stage is _Stage.BELOW_SHARE:
                give = min(give, share - caller.use)
            give = min(give, free)
            self._give(origin, give)
            grants[origin] = None
            free -= give
            # take turns: the link goes behind its caller's other links, the caller behind
            # the other callers
            del caller.hungry[origin]
            if ledger.granted <= part // 2:
                caller.hungry[origin] = None
            del self._waiting[caller]
            if caller.hungry:
                self._waiting[caller] = None
                if _admits(stage, caller, share):
                    ring.append(caller)
        return free

    def _next_hungry(self, caller: Caller[CallT], share: int) -> CreditedLink | None:
        """The caller's link whose turn it is, forgetting those that no longer want credit."""
        low = self.part(caller, share) // 2
        while caller.hungry:
            origin = next(iter(caller.hungry))
            ledger = origin.ledger
            if origin.usable and not ledger.draining and ledger.granted <= low:
                return origin
            del caller.hungry[origin]
            self._blocked.pop(origin, None)
            if not origin.usable:
                self.detach(origin)
        self._waiting.pop(caller, None)
        return None

    def _reclaim(self, share: int) -> None:
        """Links still wait with nothing free: drain the links that hold more than their part
        while another link of their connection waits, and, while callers below their share
        wait, enough credit of the callers above theirs to make up the difference. While a
        caller holding nothing waits, credit held *at* a share is drained too: with more
        callers than slots every share is one slot, and an idle link's credit would otherwise
        keep the waiting caller out for as long as that link stays quiet."""
        deficit = sum(share - c.use for c in self._waiting if c.use < share)
        floor = share - 1 if any(not c.use for c in self._waiting) else share
        coming = 0  # credit already asked back
        for origin in self._credited:
            if origin.ledger.draining:
                coming += origin.ledger.granted
        for origin in list(self._credited):
            ledger = origin.ledger
            caller = ledger.caller
            if ledger.draining:
                continue
            if not origin.usable:
                self.detach(origin)
                continue
            crowded = caller in self._waiting and ledger.granted > self.part(caller, share)
            if crowded or (coming < deficit and caller.use > floor):
                coming += ledger.granted
                self._drain(origin)

    # -- the ledger ------------------------------------------------------------------------

    def _want(self, origin: CreditedLink) -> None:
        """``origin`` wants credit: in its caller's turn, and its caller in the mailbox's."""
        ledger = origin.ledger
        if ledger.draining or origin not in self.links:
            return
        caller = ledger.caller
        caller.hungry.setdefault(origin, None)
        if not ledger.granted:
            self._blocked.setdefault(origin, trio.current_time())
        self._waiting.setdefault(caller, None)
        self._replenish()

    def _replenish(self) -> None:
        """Hand out credit soon: at once for a link with none, else in batches."""
        if self.closed or not self._waiting:
            return
        if self._blocked or self._freed >= self._batch or self.queued == 0:
            self._grant_soon.set()

    def _give(self, origin: CreditedLink, n: int) -> None:
        origin.ledger.granted += n
        origin.ledger.caller.credit += n
        self.outstanding += n
        self._credited[origin] = None
        self._blocked.pop(origin, None)

    def _take(self, origin: CreditedLink, n: int) -> None:
        """``n`` of the link's credit is used, returned, or gone with the link."""
        ledger = origin.ledger
        ledger.granted -= n
        ledger.caller.credit -= n
        self.outstanding -= n
        if not ledger.granted:
            self._credited.pop(origin, None)

    def _sync(self, origin: CreditedLink) -> None:
        """Account for the credit the link's delivery-count says the sender has used (or given
        back, answering a drain) since last time: each unit is counted once, whether it shows
        first in a transfer or in a flow."""
        ledger = origin.ledger
        count = origin.link.delivery_count
        if count != ledger.counted:
            used = serial_diff(count, ledger.counted)
            if used > 0:
                ledger.counted = count
                self._take(origin, min(used, ledger.granted))

    def _unused(self, origin: CreditedLink) -> int:
        """The credit the link holds as of its delivery-count now (a message still arriving
        has used one, though the ledger counts it only when it is whole)."""
        pending = serial_diff(origin.link.delivery_count, origin.ledger.counted)
        return max(0, origin.ledger.granted - max(0, pending))

    def _flow(self, origin: CreditedLink) -> None:
        origin.set_credit(self._unused(origin))

    def _drain(self, origin: CreditedLink) -> None:
        ledger = origin.ledger
        if ledger.draining or not origin.usable:
            return
        ledger.draining = True
        if not self.closed:  # stopping: what it sends is answered 503, whenever it comes
            ledger.drain_due = trio.current_time() + self.drain_timeout
            self._draining[origin] = None
        ledger.caller.hungry.pop(origin, None)
        self._blocked.pop(origin, None)
        credit = self._unused(origin)
        log.debug("credit.drain", link=origin.link.name, credit=credit, closing=self.closed)
        origin.drain(credit)

    def _drained(self, origin: CreditedLink) -> None:
        """``origin`` answered its drain (used or returned all of its credit)."""
        origin.ledger.draining = False
        origin.ledger.drain_due = math.inf
        self._draining.pop(origin, None)

    def _oldest_wait(self) -> float:
        """Since when the link waiting longest for credit has waited (``inf``: none waits)."""
        return next(iter(self._blocked.values()), math.inf)

    def _next_due(self) -> float:
        """When the oldest drain falls due, or a wait for credit becomes worth reporting
        (``inf``: neither is pending)."""
        due = next((origin.ledger.drain_due for origin in self._draining), math.inf)
        since = self._oldest_wait()
        if since != self._starved_since:
            due = min(due, since + STARVED_AFTER)
        return due

    def starved(self, now: float) -> tuple[float, list[str]] | None:
        """How long the longest waiting link has waited for credit, and the callers that
        hold the most of the mailbox meanwhile (calls and credit; 5 at most), if it has waited
        ``STARVED_AFTER`` seconds or more."""
        since = self._oldest_wait()
        if now - since < STARVED_AFTER:
            return None
        callers = sorted(self.callers.values(), key=lambda c: c.use, reverse=True)
        holders = [
            f"{next(iter(caller.links)).describe()}: {caller.held} calls, {caller.credit} credit"
            for caller in callers[:5]
            if caller.use and caller.links
        ]
        return now - since, holders

    def _report_starved(self, now: float) -> None:
        """Log, once per waiting link, a wait for credit past ``STARVED_AFTER``."""
        since = self._oldest_wait()
        if since == self._starved_since:
            return  # (reported already, or nobody waits: no sorting of callers for nothing)
        starved = self.starved(now)
        if starved is None:
            return
        self._starved_since = since
        waited, holders = starved
        log.warning("credit.starved", waited=round(waited, 1), holders=holders)

    def _revoke_overdue(self, now: float) -> None:
        """Take the credit back from every link whose drain is overdue: detached, so that its
        slots are free however its peer behaves (the oldest drains come first)."""
        while self._draining:
            origin = next(iter(self._draining))
            ledger = origin.ledger
            if ledger.drain_due > now:
                return
            self.revoked += 1
            origin.revoke(Error(RESOURCE_LIMIT_EXCEEDED, _REVOKED.format(self.drain_timeout)))
            self.detach(origin)  # (also forgets the drain)

    def _forget(self, caller: Caller[CallT]) -> None:
        if self.callers.get(caller.conn) is caller:
            del self.callers[caller.conn]


def _admits(stage: _Stage, caller: Caller[Any], share: int) -> bool:
    if stage is _Stage.NEWCOMERS:
        return caller.use == 0
    if stage is _Stage.BELOW_SHARE:
        return caller.use < share
    return True
