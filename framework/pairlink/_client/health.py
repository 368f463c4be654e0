"""The health check's wire form and the client side of it, shared by servers and gateways.

A request to the address ``$health`` with the operation ``check`` and an optional argument
naming a service (a gateway: a route), answered ``{"status": "serving"}``, or ``{"status":
"draining"}`` once a graceful stop has begun; an unknown name is a 404. Servers answer it with
:class:`pairlink._server.health.Health`, gateways with :mod:`pairlink._gateway.health`.

Why this shape: gRPC's health protocol (``grpc.health.v1.Health/Check``, an optional service
name, NOT_FOUND for an unknown one) is what probes such as ``grpc_health_probe`` speak, and AMQP
keeps ``$``-prefixed addresses for the nodes a container provides itself (``$management``,
``$cbs``), so ``$health`` never clashes with a user's service.
"""

from __future__ import annotations

from typing import Unpack

import trio

from pairlink._client.client import ConnectOptionsExceptTimeouts, connect
from pairlink.errors import PairlinkError

HEALTH = "$health"
"""The address of the built-in health service."""
CHECK = "check"
"""Its one operation."""
SERVING = "serving"
DRAINING = "draining"


async def check_health(
    url: str,
    service: str = "",
    *,
    timeout: float = 5.0,  # noqa: ASYNC109 - bounds the connection too, not only the call
    **options: Unpack[ConnectOptionsExceptTimeouts],
) -> str:
    """Ask the server (or gateway) at ``url`` for its health (``SERVING`` or ``DRAINING``),
    connecting and calling within ``timeout`` seconds; ``options`` go to
    :func:`pairlink.connect` (``ssl_context``...).

    Raises ``TimeoutError``, ``OSError`` (refused, unreachable), or ``PairlinkError`` (the
    server refused the login or the call, or answered something that is not a status)."""
    reply: object = None
    with trio.move_on_after(timeout) as scope:  # the handshake of a silent peer included
        async with connect(url, timeout=timeout, connect_timeout=timeout, **options) as client:
            reply = await client.call(HEALTH, CHECK, service)
    if scope.cancelled_caught:
        raise TimeoutError(f"no health answer from {url} within {timeout:g} s")
    status = reply.get("status") if isinstance(reply, dict) else None
    if not isinstance(status, str):
        raise PairlinkError(f"{url} answered the health check with {reply!r}, not a status")
    return status
