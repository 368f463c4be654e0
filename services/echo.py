"""The echo service: the smallest real service, for trying pairlink out and for benchmarks.

``pairlink serve services.echo --listen amqp://127.0.0.1:5672`` serves it at the address
``echo``; ``pairlink call amqp://127.0.0.1:5672 echo echo '"hi"'`` calls it.
"""

from __future__ import annotations

from typing import Any

import trio

from framework import handler, service


@service("echo", max_concurrency=64)
class Echo:
    """``echo(x)`` returns ``x``; ``sleep(seconds)`` answers after that long (a slow call, for
    timeouts and back-pressure). Stateless, so it lets many calls run at once."""

    @handler
    def echo(self, x: Any) -> Any:
        # sync: it runs as soon as the request is read, without a task switch
        # (framework.server.actor)
        return x

    @handler
    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
