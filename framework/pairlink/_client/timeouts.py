"""One task that times out many waiters, instead of a Trio cancel scope per waiter.

A cancel scope with a deadline costs a call about a tenth of the client's CPU time (entering
and leaving it registers and unregisters the deadline with the scheduler). A pre-settled call
only waits for its reply (its request has left, or waits in the sender's line with no task),
so it needs no scope: it registers here, and the one task of ``Timeouts.run`` wakes it when
its deadline passes. That task sleeps until the earliest deadline registered; with one
timeout for every call, later calls never move that deadline earlier, so they cost a set
insertion and removal and no wake-up.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio


class Expiring(Protocol):
    deadline: float  # Trio clock

    def expire(self) -> None:
        """The deadline passed: wake the waiter, which then times out."""


class Timeouts:
    """Waiters by deadline; ``run`` (a background task) expires them."""

    def __init__(self) -> None:
        self._waiting: set[Expiring] = set()
        self._due = math.inf  # when run() wakes next
        self._rearm = trio.Event()

    def add(self, waiter: Expiring) -> None:
        self._waiting.add(waiter)
        if waiter.deadline < self._due:
            self._due = waiter.deadline
            self._rearm.set()

    def discard(self, waiter: Expiring) -> None:
        self._waiting.discard(waiter)

    async def run(self) -> None:
        while True:
            self._rearm = trio.Event()
            with trio.move_on_at(self._due):
                await self._rearm.wait()
            self._expire(trio.current_time())

    def _expire(self, now: float) -> None:
        """Expire what is due and find the next deadline: one pass over the waiters, once
        per deadline reached (most of them long answered and gone by then)."""
        due = math.inf
        for waiter in list(self._waiting):
            if waiter.deadline <= now:
                self._waiting.discard(waiter)
                waiter.expire()
            elif waiter.deadline < due:
                due = waiter.deadline
        self._due = due
