"""Duplicate detection for a service: replies kept by message-id, so a repeat runs nothing.

Spark re-runs tasks (a failure, speculation) and a client resends after a reconnect; when the
caller gives each call a stable string message-id (``call_service(key=...)``), the service can
answer a repeat with the reply it already gave instead of running the handler again: the
handler's effect happens once per id. This is Service Bus's duplicate detection applied to RPC.

Only string message-ids are tracked: our own client numbers its calls with ints (a counter per
connection, unique on that connection only), so an int is never a caller's key. The store is
pure: the caller passes the clock (``now``, any monotonic seconds) and decides what a waiter
is. Memory is bounded twice: an outcome is kept ``window`` seconds, and at most ``size`` of
them, the oldest dropped first. Calls still running are not counted: the service's mailbox
bounds those.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from pairlink._server.calls import Answer

W = TypeVar("W")

NOT_KEPT = frozenset({408, 503})
"""Statuses that say the call did not complete (deadline, shutdown): a repeat should run it."""


class DedupStore(Generic[W]):
    """Answers by message-id, and the repeats waiting for a call still running.

    The service asks ``stored`` first (answer from the store), then ``claim``: the first
    caller of an id runs it, a repeat arriving meanwhile is parked as a waiter; ``finish``
    records the outcome and returns the waiters, to be answered with that same outcome.
    """

    def __init__(self, window: float, size: int) -> None:
        if window <= 0:
            raise ValueError("the dedup window must be > 0 seconds")
        if size < 1:
            raise ValueError("the dedup size must be >= 1")
        self.window = window
        self.size = size
        self._kept: OrderedDict[str, tuple[float, Answer]] = OrderedDict()  # by expiry
        self._running: dict[str, list[W]] = {}
        self.hits = 0
        """Repeats answered without running the handler (from the store or by waiting)."""

    def __len__(self) -> int:
        return len(self._kept)

    def stored(self, key: str, now: float) -> Answer | None:
        """The outcome kept for ``key``, if it has not expired."""
        entry = self._kept.get(key)
        if entry is None or entry[0] <= now:  # an expired one goes at the next ``finish``
            return None
        self.hits += 1
        return entry[1]

    def claim(self, key: str, waiter: W) -> bool:
        """True: nobody runs ``key``, the caller does now. False: it is running, ``waiter``
        is parked until ``finish``."""
        waiters = self._running.get(key)
        if waiters is None:
            self._running[key] = []
            return True
        waiters.append(waiter)
        self.hits += 1
        return False

    def finish(self, key: str, outcome: Answer, now: float) -> list[W]:
        """Record ``key``'s outcome (unless its status is one of ``NOT_KEPT``); the waiters
        parked behind it, who get the same outcome."""
        waiters = self._running.pop(key, [])
        if outcome.status not in NOT_KEPT:
            self._kept.pop(key, None)
            self._kept[key] = (now + self.window, outcome)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        self._expire(now)
        return waiters

    def _expire(self, now: float) -> None:
        kept = self._kept
        while kept:
            oldest = next(iter(kept))
            if kept[oldest][0] > now:
                return
            del kept[oldest]
