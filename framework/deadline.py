"""The deadline of the call being served, so that calls it makes inherit what is left of it.

A service sets it while a handler runs; the client reads it and never gives an inner call more
time than the outer caller still has. Wall-clock seconds since the epoch, as carried on the wire
in ``absolute-expiry-time``.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

_current: ContextVar[float | None] = ContextVar("pairlink_deadline", default=None)


def current() -> float | None:
    """The deadline of the call this task is serving, if any."""
    return _current.get()


def remaining(now: float | None = None) -> float | None:
    """Seconds left before the current deadline (may be negative), None without one."""
    deadline = _current.get()
    if deadline is None:
        return None
    return deadline - (time.time() if now is None else now)


def effective_timeout(timeout: float | None, now: float | None = None) -> float | None:
    """The timeout an outgoing call gets: its own, cut to what the served call has left."""
    left = remaining(now)
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
