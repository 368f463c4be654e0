"""A gateway's connection to one next hop, shared by every pair routed there.

The connection is kept up by a background task: opened when the gateway starts, reopened with
capped, jittered backoff whenever it is lost, so a restarted next hop is found again without
waiting for traffic. While it is down, new pairs fail at once (``UpstreamUnavailable``) rather
than wait: the requester learns in one round trip that the route is broken, and may retry.
"""

from __future__ import annotations

import math
import ssl
from urllib.parse import quote

import structlog
import trio

from framework import transport
from framework.backoff import jittered_backoff
from framework.errors import PairlinkError
from framework.gateway.config import Route
from framework.linkpair import LINK_PAIR_V1_0, offers_pairing

log = structlog.get_logger("pairlink.gateway")

RETRY_DELAY = 0.1
MAX_RETRY_DELAY = 5.0


class UpstreamUnavailable(PairlinkError):
    """The next hop cannot be reached now (never connected, or lost and not back yet)."""


class Upstream:
    """One connection to ``route.upstream`` with ``route``'s credentials (routes that share
    both share the connection, and so its session: many pairs on one socket)."""

    def __init__(
        self, route: Route, *, container_id: str, idle_timeout: float, connect_timeout: float
    ) -> None:
        url = transport.AmqpUrl.parse(route.upstream)
        self.where = f"{url.host}:{url.port}"  # for logs only: never sent downstream
        credentials = ""
        if route.user is not None:
            credentials = f"{quote(route.user, safe='')}:{quote(route.password or '', safe='')}@"
        self._url = f"{url.scheme}://{credentials}{url.host}:{url.port}"
        self._ssl_context = ssl.create_default_context(cafile=route.ca) if url.tls else None
        self._container_id = container_id
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self.current: transport.AmqpConnection | None = None
        self.tried = trio.Event()  # the first attempt is over, whatever its result
        self._failures = 0
        self._log = log.bind(upstream=self.where)

    async def connection(self) -> transport.AmqpConnection:
        """The live connection; waits only for the very first attempt to finish."""
        await self.tried.wait()
        conn = self.current
        if conn is None or conn.closed.is_set():
            raise UpstreamUnavailable("the next hop is unreachable")
        return conn

    async def run(self) -> None:
        """Keep the connection up until cancelled."""
        while True:
            try:
                await self._hold()
            except (*transport.CONNECT_FAILURES, PairlinkError, TimeoutError) as exc:
                self._failures += 1
                delay = jittered_backoff(self._failures, RETRY_DELAY, MAX_RETRY_DELAY)
                self._log.warning(
                    "upstream.unreachable",
                    attempt=self._failures,
                    retry_in=round(delay, 3),
                    error=str(exc),
                )
            else:
                self._failures = 1  # it was up: start again from a short delay
                delay = jittered_backoff(self._failures, RETRY_DELAY, MAX_RETRY_DELAY)
            finally:
                self.current = None
                self.tried.set()
            await trio.sleep(delay)

    async def _hold(self) -> None:
        with trio.move_on_after(self._connect_timeout) as scope:
            async with transport.connect(
                self._url,
                ssl_context=self._ssl_context,
                connect_timeout=self._connect_timeout,
                container_id=self._container_id,
                idle_timeout=self._idle_timeout,
                desired_capabilities=[LINK_PAIR_V1_0],
            ) as conn:
                conn.session  # noqa: B018 - begun now, in the same write as our open
                await conn.wait_opened()
                scope.deadline = math.inf
                if not offers_pairing(conn.engine.remote_offered_capabilities):
                    # LP-2: we may not initiate pairs there; a configuration error to report
                    raise UpstreamUnavailable("the next hop does not offer LINK_PAIR_V1_0")
                self.current = conn
                self._failures = 0
                self.tried.set()
                self._log.info("upstream.connected", conn=conn.id)
                await conn.closed.wait()
                self._log.warning("upstream.lost", error=str(conn.error or "closed"))
        if scope.cancelled_caught:
            raise TimeoutError(f"not connected within {self._connect_timeout} s")
