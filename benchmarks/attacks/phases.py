"""Every phase of an attack is bounded: a phase that overruns is the script's failure, named.
And how a row words what it counted (:func:`tally`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import trio

STEP_TIMEOUT = 30.0
"""Seconds for one step of an attack that should take well under a second (connect, an
attach's answer, a write the server should take)."""


class PhaseTimeout(Exception):
    """A phase of an attack took longer than its bound: the script's failure, not a finding."""


@contextmanager
def phase(what: str, seconds: float) -> Iterator[None]:
    """``trio.fail_after`` that says which phase was too slow."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise PhaseTimeout(f"{what}: over {seconds:g} s") from None


def tally(counts: Mapping[str, int]) -> str:
    """``counts`` as a row says them: ``"3x closed, 1,200x refused"`` (empty: ``""``)."""
    return ", ".join(f"{n:,}x {what}" for what, n in counts.items())
