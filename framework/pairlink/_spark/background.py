"""A pairlink server in a thread of its own, for synchronous code: a Spark driver, a script.

The driver's progress side channel is such a server, and so is a service a demo or a test runs
next to its Spark session: Spark's API blocks, so the server cannot share the caller's thread.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from typing import Unpack

import trio

from pairlink._io.threads import start_trio_thread
from pairlink._server.serving import ServeOptions, Server, open_server


@contextlib.contextmanager
def serve_in_thread(
    *services: object,
    listen: str = "amqp://127.0.0.1:0",
    users: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **options: Unpack[ServeOptions],
) -> Iterator[Server]:
    """Serve ``services`` (as :func:`pairlink.open_server` takes them) from a daemon thread
    running its own Trio loop, for the duration of the block; yields the running server
    (``server.url``). A failure to start is raised here. Leaving the block shuts the server
    down gracefully (not by cancelling it) and joins the thread."""

    async def serve(*, task_status: trio.TaskStatus[tuple[Server, trio.Event]]) -> None:
        async with open_server(
            *services, listen=listen, users=users, ssl_context=ssl_context, **options
        ) as server:
            stop = trio.Event()
            task_status.started((server, stop))
            await stop.wait()

    thread = start_trio_thread(serve, name="pairlink-server")
    server, stop = thread.value
    try:
        yield server
    finally:
        with contextlib.suppress(trio.RunFinishedError):  # it failed meanwhile: join raises it
            thread.run_sync(stop.set)
        thread.join()
