"""Retry delays shared by everything that reconnects (clients, gateway upstreams)."""

from __future__ import annotations

import random


def jittered_backoff(failures: int, base: float, cap: float) -> float:
    """The delay before attempt ``failures + 1``: exponential from ``base``, capped at ``cap``,
    half fixed and half random, so that many peers cut off together do not come back in
    lockstep."""
    ceiling = min(cap, base * 2.0 ** (max(failures, 1) - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)
