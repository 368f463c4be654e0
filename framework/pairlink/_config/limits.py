"""Every bound a listening pairlink process keeps against its peers, in one object.

Each default is a documented constant beside the code that enforces it; :class:`Limits`
gathers them so that a service (``open_server(limits=...)``) or a gateway (its config file's
``[limits]`` table) sets them in one place, and the README can list them in one table.
"""

from __future__ import annotations

import attrs

from pairlink._amqp.codec import MAX_ELEMENTS
from pairlink._amqp.config import MAX_LINKS, MAX_MESSAGE_SIZE
from pairlink._amqp.link import MAX_INCOMPLETE_BYTES, MAX_UNSETTLED
from pairlink._amqp.session import HANDLE_MAX, MAX_SESSION_UNSETTLED
from pairlink._io.listener import HANDSHAKE_TIMEOUT
from pairlink._io.login_throttle import LOGIN_PENALTY, LoginThrottle
from pairlink._io.net import EngineLimits
from pairlink._io.writes import MAX_OUTGOING_BYTES
from pairlink._rpc.batch import MAX_BATCH_ROWS

MAX_LINKS_TOTAL = 65_536
"""Links a server holds at once across all its connections (each costs about 3 KiB, so about
190 MiB at most): past it, a new link is refused with ``amqp:resource-limit-exceeded``, however
many connections the links come on (shared as :mod:`pairlink._server.link_budget` says)."""
DRAIN_TIMEOUT = 5.0
"""Seconds a request link has to answer a drain (send what it can, give the rest of its credit
back) before the service takes the credit back itself: the link is detached with
``amqp:resource-limit-exceeded`` and its slots return to the mailbox. An honest peer answers in
one round trip; this bounds how long one that never does can keep others waiting."""


class ListenLimits(EngineLimits, total=False):
    """The keywords of :func:`pairlink._io.listener.listen` that :meth:`Limits.listen_options`
    gives."""

    handshake_timeout: float
    max_connections: int | None
    max_outgoing_bytes: int
    login_throttle: LoginThrottle | None


@attrs.frozen(kw_only=True)
class Limits:
    """The bounds of one listener's connections (see the README's "Limits" table).

    ``handshake_timeout``: seconds a new connection has to finish TLS, SASL and open.
    ``max_connections``: connections at once (None: three quarters of the open-file limit);
    when full, the oldest one still in its handshake makes room, else a new one is refused.
    ``max_outgoing_bytes``: what a connection holds for a peer that does not read it.
    ``login_penalty``: seconds between login attempts from an address that just failed one.
    ``max_message_size``, ``max_incomplete_bytes``, ``max_unsettled``, ``max_session_unsettled``,
    ``max_decoded_elements``, ``handle_max``, ``max_links``: the engine's bounds
    (``ConnectionConfig``). ``drain_timeout``: seconds a caller's request link has to answer
    a service's drain before its credit is revoked; ``max_links_total``: links a server holds
    across all its connections; ``max_batch_rows``: rows one batch may carry (the three for
    services only).
    """

    handshake_timeout: float = HANDSHAKE_TIMEOUT
    max_connections: int | None = None
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES
    login_penalty: float = LOGIN_PENALTY
    max_message_size: int = MAX_MESSAGE_SIZE
    max_incomplete_bytes: int = MAX_INCOMPLETE_BYTES
    max_unsettled: int = MAX_UNSETTLED
    max_session_unsettled: int = MAX_SESSION_UNSETTLED
    max_decoded_elements: int = MAX_ELEMENTS
    handle_max: int = HANDLE_MAX
    max_links: int = MAX_LINKS
    drain_timeout: float = DRAIN_TIMEOUT
    max_links_total: int = MAX_LINKS_TOTAL
    max_batch_rows: int = MAX_BATCH_ROWS

    def engine_options(self) -> EngineLimits:
        """The ``ConnectionConfig`` fields among these (for ``connect`` too)."""
        return {
            "max_message_size": self.max_message_size,
            "max_incomplete_bytes": self.max_incomplete_bytes,
            "max_unsettled": self.max_unsettled,
            "max_session_unsettled": self.max_session_unsettled,
            "max_decoded_elements": self.max_decoded_elements,
            "handle_max": self.handle_max,
            "max_links": self.max_links,
        }

    def listen_options(self) -> ListenLimits:
        """Keyword arguments for :func:`pairlink._io.listener.listen`."""
        return {
            "handshake_timeout": self.handshake_timeout,
            "max_connections": self.max_connections,
            "max_outgoing_bytes": self.max_outgoing_bytes,
            "login_throttle": LoginThrottle(penalty=self.login_penalty),
            **self.engine_options(),
        }
