"""Where a connection is in its life, one value, and what its IO parts ask of the connection.

:class:`pairlink._io.connection.AmqpConnection` alone moves the state; its reader and timer
(:mod:`pairlink._io.inputs`) and its writer (:mod:`pairlink._io.writes`) read it, and hand what
they learn back through :class:`LiveConnection`, which they know only as that protocol (the
connection imports them, not the other way round).
"""

from __future__ import annotations

import enum
from typing import Protocol

from pairlink._amqp.events import Event
from pairlink._amqp.link import Link
from pairlink._telemetry.logs import Logger
from pairlink.errors import ConnectionLostError


class Lifecycle(enum.IntEnum):
    """A connection's state. It only moves forward, so ``state >= CLOSED`` reads "over"."""

    OPENING = 1
    """Protocol headers, SASL and our open: until the peer's open."""
    OPEN = 2
    """The peer's open arrived."""
    CLOSED = 3
    """Over (closed by either side, lost, refused): no more actions. What the engine queued
    still goes out, and the reader reads on to the peer's EOF."""
    ABANDONED = 4
    """Over by our own doing (an exception in handling its input, or ``abort``): the rest of
    its input is read and ignored."""


# The hot checks compare with these: a member looked up on its class costs several times a
# module global on Python 3.11.
OPENING = Lifecycle.OPENING
OPEN = Lifecycle.OPEN
CLOSED = Lifecycle.CLOSED
ABANDONED = Lifecycle.ABANDONED


class LiveConnection(Protocol):
    """What a connection's reader, timer and writer need of it."""

    state: Lifecycle
    error: ConnectionLostError | None
    log: Logger

    def dispatch(self, events: list[Event], lost: str | None = None) -> None:
        """Act on what the engine said; ``lost``: the transport is gone, for that reason."""

    def abandon(self, exc: Exception) -> None:
        """An exception escaped our handling of the connection's input: close it alone."""

    def finish(self, error: ConnectionLostError | None, *, abandoned: bool = False) -> None:
        """The connection is over (``error`` says why, if it failed)."""

    def flow(self, link: Link, credit: int, *, drain: bool = False) -> None:
        """Set ``link``'s credit, as the layers above do (credit held back, given at last)."""
