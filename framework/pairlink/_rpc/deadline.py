"""Deadlines on the wall clock: the deadline of the call being served, and the clock itself.

A service sets the deadline while a handler runs; the client reads it and never gives an inner
call more time than the outer caller still has. Wall-clock seconds since the epoch, as carried on
the wire in ``absolute-expiry-time``.

Every wall-clock reading about deadlines goes through :func:`wall_time`, so that one switch,
:func:`wall_clock`, moves them all: a test on ``trio.testing.MockClock`` makes the wall clock
follow the Trio clock, and deadlines then pass when the mock clock says, not the real one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[float | None] = ContextVar("pairlink_deadline", default=None)
_wall: Callable[[], float] = time.time


def wall_time() -> float:
    """Now, in the seconds since the epoch that deadlines are written in."""
    return _wall()


@contextmanager
def wall_clock(read: Callable[[], float]) -> Iterator[None]:
    """Read the wall clock from ``read`` instead of ``time.time`` while the block runs.

    Process-wide, not per task: a call's two ends (a client and a service in one test, a
    blocking client in its own thread) must agree on what time it is. For a test on a mock
    clock, ``read`` is the mock clock plus a fixed epoch, for example
    ``lambda: clock.current_time() + 1.7e9``: ``MockClock.current_time`` may be read from any
    thread, which ``trio.current_time`` may not.
    """
    global _wall
    saved, _wall = _wall, read
    try:
        yield
    finally:
        _wall = saved


def remaining() -> float | None:
    """Seconds left before the deadline of the call this task serves (may be negative), None
    without one."""
    deadline = _current.get()
    return None if deadline is None else deadline - _wall()


def effective_timeout(timeout: float | None) -> float | None:
    """The timeout an outgoing call gets: its own, cut to what the served call has left."""
    left = remaining()
    if left is None:
        return timeout
    return left if timeout is None else min(timeout, left)


class serving:  # lower case: used like the function it replaced, `with serving(deadline):`
    """Run a handler under ``deadline`` (restored afterwards). A class, not a generator-based
    context manager: it is entered once per call served, and this costs less than half as much."""

    __slots__ = ("_deadline", "_token")

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline

    def __enter__(self) -> None:
        self._token = _current.set(self._deadline)

    def __exit__(self, *_exc: object) -> None:
        _current.reset(self._token)
