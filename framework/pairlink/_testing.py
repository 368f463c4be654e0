"""In-memory serving for :mod:`pairlink.testing`: a server and its clients over stream pairs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Unpack

from pairlink._client.client import Client, connect
from pairlink._client.options import ConnectOptionsExceptConnector
from pairlink._server.serving import ServeOptions, Server, open_server


@asynccontextmanager
async def connect_in_memory(
    server: Server, **options: Unpack[ConnectOptionsExceptConnector]
) -> AsyncIterator[Client]:
    """A client of ``server`` over in-memory streams, a new pair per connection, whether the
    server listens on a socket or not. ``options``: those of :func:`pairlink.connect`."""
    assert server.listener is not None, "the server is not listening yet"
    async with connect(server.url, connector=server.listener.open_stream, **options) as client:
        yield client


@asynccontextmanager
async def serve_in_memory(
    *services: object,
    client: ConnectOptionsExceptConnector | None = None,
    **options: Unpack[ServeOptions],
) -> AsyncIterator[Client]:
    """Serve ``services`` with no socket for the duration of the block, and yield a client
    connected to them in memory: ``async with serve_in_memory(Calculator) as client``.

    ``options``: those of :func:`pairlink.open_server` (``grace``, ``limits``...);
    ``client``: those of :func:`pairlink.connect` (``timeout``, ``reconnect``...).
    Leaving the block closes the client, then stops the server gracefully.
    """
    async with (
        open_server(*services, listen=None, **options) as server,
        connect_in_memory(server, **(client or {})) as connected,
    ):
        yield connected
