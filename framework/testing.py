"""Helpers for testing services: call them through the real container, engine and client over
in-memory streams, no sockets, in a Trio test.

``serve_in_memory(Calculator)`` is a client of a server that serves ``Calculator`` and opens
no socket: each of the client's connections (a reconnect too) is a new in-memory stream pair
whose other end the server's listener serves like an accepted socket (the same handshake,
SASL ANONYMOUS, limits and container). With no real I/O, Trio's ``autojump_clock`` drives
timeouts and deadlines in no time (deadlines travel as wall-clock times: have
:func:`framework.rpc.deadline.wall_clock` read the mock clock).

For more than one client, or to reach the server itself, open it with
``open_server(..., listen=None)`` and connect each client with :func:`connect_in_memory`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from framework.client.client import Client, connect
from framework.server.serving import Server, open_server

__all__ = ["connect_in_memory", "serve_in_memory"]


@asynccontextmanager
async def connect_in_memory(server: Server, **options: Any) -> AsyncIterator[Client]:
    """A client of ``server`` over in-memory streams, a new pair per connection, whether the
    server listens on a socket or not. ``options``: those of :func:`framework.connect`."""
    assert server.listener is not None, "the server is not listening yet"
    async with connect(server.url, connector=server.listener.open_stream, **options) as client:
        yield client


@asynccontextmanager
async def serve_in_memory(
    *services: object, client: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[Client]:
    """Serve ``services`` with no socket for the duration of the block, and yield a client
    connected to them in memory: ``async with serve_in_memory(Calculator) as client``.

    ``options``: those of :func:`framework.open_server` (``grace``, ``limits``...);
    ``client``: those of :func:`framework.connect` (``timeout``, ``reconnect``...).
    Leaving the block closes the client, then stops the server gracefully.
    """
    async with (
        open_server(*services, listen=None, **options) as server,
        connect_in_memory(server, **(client or {})) as connected,
    ):
        yield connected
