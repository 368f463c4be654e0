"""Idle timeouts (Part 2 §2.4.5): when the peer is dead, when we owe it a heartbeat.

Only numbers the caller passes are times. Input and output are counted as they happen and
dated at once when the caller gives the time with them, else by the first ``check`` that sees
them (up to one timer period late, which made a 30 s timeout take 59 s).
"""

from __future__ import annotations

import enum


class Due(enum.Enum):
    """What ``check`` found."""

    NOTHING = "nothing"
    HEARTBEAT = "heartbeat"  # write an empty frame: the peer expects something by now
    DEAD = "dead"  # the peer sent nothing within our idle timeout


class Liveness:
    """The two idle timeouts of one connection: ours (``local``, seconds of silence after which
    the peer is dead) and the peer's (``remote``, set from its open: we write at least every
    half of it)."""

    __slots__ = ("_rx", "_rx_mark", "_rx_seen", "_tx", "_tx_mark", "_tx_seen", "local", "remote")

    def __init__(self, local: float | None) -> None:
        self.local = local
        self.remote: float | None = None
        self._rx = self._tx = 0
        self._rx_seen = self._tx_seen = -1
        self._rx_mark = self._tx_mark = 0.0

    def received(self, now: float | None) -> None:
        """Bytes came from the peer (at ``now``, if the caller knows)."""
        self._rx += 1
        if now is not None:
            self._rx_seen, self._rx_mark = self._rx, now

    def sent(self, now: float | None) -> None:
        """Bytes went to the peer (at ``now``, if the caller knows)."""
        self._tx += 1
        if now is not None:
            self._tx_seen, self._tx_mark = self._tx, now

    def check(self, now: float, *, watching: bool, may_write: bool) -> tuple[Due, float | None]:
        """What is due at ``now``, and when to check next (None: never). ``watching``: our
        timeout runs (our open is out); ``may_write``: a heartbeat may go out."""
        if self._rx != self._rx_seen:
            self._rx_seen, self._rx_mark = self._rx, now
        if self._tx != self._tx_seen:
            self._tx_seen, self._tx_mark = self._tx, now
        # each test compares ``now`` with the very deadline it would name (``mark + period``,
        # not ``now - mark >= period``): the two differ by a rounding, and a timer woken at
        # the deadline would find nothing due and be told to wake at once, forever
        due = Due.NOTHING
        deadlines = []
        if self.local is not None and watching:
            dead_at = self._rx_mark + self.local
            if now >= dead_at:
                return Due.DEAD, None
            deadlines.append(dead_at)
        if self.remote and may_write:
            beat_at = self._tx_mark + self.remote / 2
            if now >= beat_at:
                due = Due.HEARTBEAT
                self._tx_mark = now
                beat_at = now + self.remote / 2
            deadlines.append(beat_at)
        return due, min(deadlines) if deadlines else None
