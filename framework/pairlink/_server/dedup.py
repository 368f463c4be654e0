"""Duplicate detection for a service: replies kept per caller and message-id, so a repeat runs
nothing.

Spark re-runs tasks (a failure, speculation) and a client resends after a reconnect; when the
caller gives each call a stable string message-id (``call_service(key=...)``), the service can
answer a repeat with the reply it already gave instead of running the handler again: the
handler's effect happens once per id. This is Service Bus's duplicate detection applied to RPC.

A repeat is recognised by who called and what it asks, not by the message-id alone: the key
is the caller and the message-id, and each call's fingerprint (the operation and a digest of
its arguments) must match the one the id was first used for. The caller is the SASL user, or,
behind a gateway the service trusts to vouch (``vouching_users``), the caller that gateway
named and the gateways it came through (:mod:`pairlink._rpc.caller`): two users behind one
gateway are two callers. So one caller never gets another's reply (a different caller is a
different key), and an id reused for a different call is refused (:class:`ReusedId`), never
answered with the other call's reply.

Only string message-ids up to ``MAX_ID_LENGTH`` characters are tracked: our own client numbers
its calls with ints (a counter per connection, unique on that connection only), so an int is
never a caller's key. The store is pure: the caller passes the clock (``now``, any monotonic
seconds) and decides what a waiter is. Memory is bounded three times: an answer is kept
``window`` seconds, at most ``size`` of them, and at most ``max_bytes`` of replies, the oldest
dropped first. Calls still running are not counted: the service's mailbox bounds those.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Generic, TypeVar

import attrs

from pairlink._rpc.payload import msgpack_dumps
from pairlink._server.calls import Answer, DedupKey
from pairlink.errors import PayloadError

W = TypeVar("W")

NOT_KEPT = frozenset({408, 503})
"""Statuses that say the call did not complete (deadline, shutdown): a repeat should run it."""
MAX_ID_LENGTH = 256
"""The longest message-id kept (characters): a longer one runs its call as if untracked."""
DEDUP_BYTES = 64 << 20
"""Bytes of replies a service keeps at most (64 MiB), the oldest dropped first."""


def digest(operation: str, args: list[Any], kwargs: dict[str, Any]) -> bytes:
    """What a call asks, in 16 bytes: its operation and a digest of its arguments (msgpack,
    or their repr for values msgpack cannot hold), so that an id reused for another call
    shows."""
    try:
        asked = msgpack_dumps([operation, args, kwargs])
    except PayloadError:
        asked = repr((operation, args, kwargs)).encode()
    return hashlib.blake2b(asked, digest_size=16).digest()


class ReusedId(Exception):
    """The message-id was first used, by this caller, for a different call."""


@attrs.frozen
class _Kept:
    expires: float
    fingerprint: bytes
    answer: Answer
    size: int


@attrs.define
class _Running(Generic[W]):
    fingerprint: bytes
    waiters: list[W] = attrs.field(factory=list)


class DedupStore(Generic[W]):
    """Answers by caller and message-id, and the repeats waiting for a call still running.

    The service asks ``stored`` first (answer from the store), then ``claim``: the first
    caller of an id runs it, a repeat arriving meanwhile is parked as a waiter; ``finish``
    records the answer and returns the waiters, to be answered with that same answer. Both
    raise :class:`ReusedId` for an id whose call does not match its fingerprint.
    """

    def __init__(self, window: float, size: int, max_bytes: int = DEDUP_BYTES) -> None:
        if window <= 0:
            raise ValueError("the dedup window must be > 0 seconds")
        if size < 1:
            raise ValueError("the dedup size must be >= 1")
        self.window = window
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0  # of the replies kept
        self._kept: OrderedDict[DedupKey, _Kept] = OrderedDict()  # by expiry
        self._running: dict[DedupKey, _Running[W]] = {}
        self.hits = 0
        """Repeats answered without running the handler (from the store or by waiting)."""

    def __len__(self) -> int:
        return len(self._kept)

    def stored(self, key: DedupKey, fingerprint: bytes, now: float) -> Answer | None:
        """The answer kept for ``key``, if it has not expired."""
        kept = self._kept.get(key)
        if kept is None or kept.expires <= now:  # an expired one goes at the next ``finish``
            return None
        if kept.fingerprint != fingerprint:
            raise ReusedId
        self.hits += 1
        return kept.answer

    def claim(self, key: DedupKey, fingerprint: bytes, waiter: W) -> bool:
        """True: nobody runs ``key``, the caller does now. False: it is running, ``waiter``
        is parked until ``finish``."""
        running = self._running.get(key)
        if running is None:
            self._running[key] = _Running(fingerprint)
            return True
        if running.fingerprint != fingerprint:
            raise ReusedId
        running.waiters.append(waiter)
        self.hits += 1
        return False

    def finish(self, key: DedupKey, answer: Answer, now: float, size: int) -> list[W]:
        """Record ``key``'s answer, whose reply is ``size`` bytes (unless its status is one of
        ``NOT_KEPT``, or the reply alone is larger than the store); the waiters parked behind
        it, who get the same answer."""
        running = self._running.pop(key, None)
        if running is None:
            return []
        if answer.status not in NOT_KEPT and size <= self.max_bytes:
            self._drop(key)
            self._kept[key] = _Kept(now + self.window, running.fingerprint, answer, size)
            self.bytes += size
            while len(self._kept) > self.size or self.bytes > self.max_bytes:
                self._drop(next(iter(self._kept)))
        self._expire(now)
        return running.waiters

    def _drop(self, key: DedupKey) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept.size

    def _expire(self, now: float) -> None:
        kept = self._kept
        while kept:
            oldest = next(iter(kept))
            if kept[oldest].expires > now:
                return
            self._drop(oldest)
