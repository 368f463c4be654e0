"""The echo service: the smallest real service, for trying pairlink out and for benchmarks.

``pairlink serve services.echo --listen amqp://127.0.0.1:5672`` serves it at the address
``echo``; ``pairlink call amqp://127.0.0.1:5672 echo echo '"hi"'`` calls it.
"""

from __future__ import annotations

from typing import Any

import trio

from pairlink import handler, service


@service("echo", max_concurrency=64)
class Echo:
    """``echo(x)`` returns ``x``; ``sleep(seconds)`` answers after that long (a slow call, for
    timeouts and back-pressure). Stateless, so it lets many calls run at once.

    ``echo_thread`` and ``echo_async`` are the same echo as the two other kinds of handler, so
    that ``benchmarks.rpc`` can tell what each kind costs on one workload."""

    @handler(inline=True)
    def echo(self, x: Any) -> Any:
        # inline: it runs on the event loop as soon as the request is read, without a thread
        # or a task switch (pairlink._server.actor); right for a handler that never blocks
        return x

    @handler
    def echo_thread(self, x: Any) -> Any:
        return x

    @handler
    async def echo_async(self, x: Any) -> Any:
        return x

    @handler
    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
