"""The client side of the health check (its wire form: :mod:`pairlink._client.status`):
``check_health`` asks a server or gateway once."""

from __future__ import annotations

from typing import Unpack

import trio

from pairlink._client.client import connect
from pairlink._client.options import ConnectOptionsExceptTimeouts
from pairlink._client.status import CHECK as CHECK
from pairlink._client.status import DRAINING as DRAINING
from pairlink._client.status import HEALTH as HEALTH
from pairlink._client.status import SERVING as SERVING
from pairlink._io.net import redacted
from pairlink.errors import PairlinkError


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
        raise TimeoutError(f"no health answer from {redacted(url)} within {timeout:g} s")
    status = reply.get("status") if isinstance(reply, dict) else None
    if not isinstance(status, str):
        raise PairlinkError(
            f"{redacted(url)} answered the health check with {reply!r}, not a status"
        )
    return status
