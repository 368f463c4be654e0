"""The health service every server answers, for container orchestrators and load balancers.

Wire form: a request to the address ``$health`` with the operation ``check`` (in
``application-properties["operation"]``, as for any service) and an optional argument naming a
service, answered with ``{"status": "serving"}``, or ``{"status": "draining"}`` once a graceful
stop has begun. It is an ordinary service of the container, so any AMQP 1.0 peer reaches it the
way it reaches the others (paired links, a reply link, or a dynamic node; ``amqp-value`` bodies).

Why this shape: gRPC's health protocol (``grpc.health.v1.Health/Check``, an optional service
name, NOT_FOUND for an unknown one) is what probes such as ``grpc_health_probe`` speak, and AMQP
keeps ``$``-prefixed addresses for the nodes a container provides itself (``$management``,
``$cbs``), so ``$health`` never clashes with a user's service (the server refuses one there).
Its actor has a mailbox of its own: probes never take a user service's credit, and a service
whose mailbox is full still reports ``serving``. It keeps answering through the graceful drain,
so an orchestrator sees ``draining`` until the listener closes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import trio

from framework.client.client import connect
from framework.errors import PairlinkError
from framework.rpc.wire import NOT_FOUND, CallError
from framework.server.service import handler, service

HEALTH = "$health"
"""The address of the built-in health service."""
SERVING = "serving"
DRAINING = "draining"


@service(HEALTH, max_concurrency=4, mailbox=16)
class Health:
    """Reports the server's state: :data:`SERVING`, or :data:`DRAINING` once it stops."""

    def __init__(self, services: Collection[str]) -> None:
        self.services = services
        self.status = SERVING

    @handler
    async def check(self, service: str = "") -> dict[str, str]:
        """The server's status, or that of one of its services (``""``: the whole server);
        an unknown service is a 404, as gRPC answers NOT_FOUND."""
        if service and service not in self.services:
            raise CallError(NOT_FOUND, f"no service at the address {service!r}")
        return {"status": self.status}


async def check_health(
    url: str,
    service: str = "",
    *,
    timeout: float = 5.0,  # noqa: ASYNC109 - bounds the connection too, not only the call
    **options: Any,
) -> str:
    """Ask the server at ``url`` for its health (``SERVING`` or ``DRAINING``), connecting
    and calling within ``timeout`` seconds; ``options`` go to
    :func:`framework.client.client.connect` (``ssl_context``...).

    Raises ``TimeoutError``, ``OSError`` (refused, unreachable), or ``PairlinkError`` (the
    server refused the login or the call, or answered something that is not a status)."""
    reply: Any = None
    with trio.move_on_after(timeout) as scope:  # the handshake of a silent peer included
        async with connect(url, timeout=timeout, connect_timeout=timeout, **options) as client:
            reply = await client.call(HEALTH, "check", service)
    if scope.cancelled_caught:
        raise TimeoutError(f"no health answer from {url} within {timeout:g} s")
    status = reply.get("status") if isinstance(reply, dict) else None
    if not isinstance(status, str):
        raise PairlinkError(f"{url} answered the health check with {reply!r}, not a status")
    return status
