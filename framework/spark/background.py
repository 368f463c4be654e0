"""A pairlink server in a thread of its own, for synchronous code: a Spark driver, a script.

The driver's progress side channel is such a server, and so is a service a demo or a test runs
next to its Spark session: Spark's API blocks, so the server cannot share the caller's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from framework.container import Server
from framework.service import open_server


@contextmanager
def serve_in_thread(
    *services: object, listen: str = "amqp://127.0.0.1:0", **options: Any
) -> Iterator[Server]:
    """Serve ``services`` (as :func:`framework.open_server` takes them) from a daemon thread
    running its own Trio loop, for the duration of the block; yields the running server
    (``server.url``). Leaving the block shuts it down gracefully and joins the thread."""
    started = threading.Event()
    failed: list[BaseException] = []
    held: list[tuple[Server, trio.lowlevel.TrioToken, trio.Event]] = []

    async def main() -> None:
        async with open_server(*services, listen=listen, **options) as server:
            stop = trio.Event()
            held.append((server, trio.lowlevel.current_trio_token(), stop))
            started.set()
            await stop.wait()

    def target() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # a start-up failure, raised in the caller's thread
            failed.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=target, name="pairlink-server", daemon=True)
    thread.start()
    started.wait()
    if not held:
        thread.join()
        raise failed[0] if failed else RuntimeError("the server thread ended before serving")
    server, token, stop = held[0]
    try:
        yield server
    finally:
        token.run_sync_soon(stop.set)
        thread.join()
