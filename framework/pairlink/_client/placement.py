"""Where the next call goes among replicas: the ready one with the most free credit.

A pair's credit is the room its replica's mailbox gave it: a replica with none left gets no
call while another has some, and among full ones the shortest line of calls waiting for credit
wins. Credit shows room only in batches, though (a service grants it again once half is
used), so among replicas that all have credit the one with the fewest calls in flight wins: a
slower replica, whose calls stay longer, gets fewer. Among equals the turn rotates, so equal
replicas share evenly. Qpid Dispatch's "balanced" distribution follows the same rule (fewest
unsettled deliveries among the consumers with credit).

I/O-free: the client's replicas (:mod:`pairlink._client.replicas`) use it for calls, and a
gateway route placing pairs across its upstreams can use it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal, TypeVar

T = TypeVar("T")

ReplicaState = Literal["connecting", "ready", "draining", "lost"]
"""What a replica is to its caller: ``connecting`` (no connection yet, or its first health
answer has not come), ``ready`` (takes calls), ``draining`` (its ``$health`` says it stops:
it finishes what it holds and takes nothing new), ``lost`` (its connection failed or timed out,
or was refused: retried with backoff)."""

CONNECTING: Final = "connecting"
READY: Final = "ready"
DRAINING: Final = "draining"
LOST: Final = "lost"


_HAS_CREDIT = 1 << 40
"""Above any ``room`` of a full replica: credit first, then the fewest in flight."""


def room(free_credit: int, in_flight: int) -> int:
    """The key replicas are ranked by, higher first: any with ``free_credit`` (credit not used
    and not promised to calls waiting in line; below zero: that many wait) before any without,
    then the fewest calls ``in_flight``; of full ones, the shortest line."""
    if free_credit > 0:
        return _HAS_CREDIT - in_flight
    return free_credit


class Rotation:
    """The most-free-credit rule with rotating ties; one per set of replicas."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[T], credit: Callable[[T], int]) -> T | None:
        """The candidate with the most ``credit`` (its :func:`room`; None if there is no
        candidate); of several with the most, the one whose turn it is. Candidates are the
        usable ones only: the caller leaves out replicas that are not ``READY``."""
        count = len(candidates)
        if count == 0:
            return None
        if count == 1:
            return candidates[0]
        start = self._turn % count
        best = start
        most = credit(candidates[start])
        # one pass from the turn's position on: the first of the best wins the tie, and the
        # next turn starts just after it, so tied candidates take turns
        for step in range(1, count):
            index = (start + step) % count
            free = credit(candidates[index])
            if free > most:
                best, most = index, free
        self._turn = best + 1
        return candidates[best]
