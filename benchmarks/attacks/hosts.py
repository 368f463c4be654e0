"""The processes of the many-parties rows (issue 22) that ``pairlink serve`` alone cannot start.

``python -m benchmarks.attacks.hosts NAME``, NAME one of:

- ``bank``: the tests' deduplicating ``Bank`` (its middleware refusing bob) for alice and bob;
- ``gateway``: a gateway routing ``echo`` to an echo server in the same process, for the user
  ``apps`` (the allowed organisation) and ``guest`` (a user no route allows);
- ``connect-deadline``: our client against a listener that never speaks and a peer deaf to
  close, each timed; one JSON line each on stdout.

They run the pairlink first on their PYTHONPATH: the one under test (``--code``). Each says
where it listens in the log line the driver reads (``server.listening``/``gateway.listening``
``url=...``); :class:`Keep` is served by ``pairlink serve`` itself.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog
import trio

from benchmarks.attacks.children import LISTEN, log_to_stderr
from pairlink import connect, handler, open_server, serve, service
from pairlink.gateway import GatewayConfig, Route, open_gateway
from services.echo import Echo
from tests.hostile_services import Bank

BANK_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
"""The bank's users: alice may transfer, bob is refused (403) by its middleware."""
APPS, GUEST = "apps", "guest"
GATEWAY_USERS = {APPS: "apps-secret", GUEST: "guest-secret"}
"""The gateway's users: ``apps`` is allowed on the ``echo`` route, ``guest`` on none."""
ROUTE = "echo"
"""The gateway's one route (to the echo service in its process)."""
DEADLINE = 2.0
"""The ``timeout`` connect-deadline gives ``connect()`` against the listener that never speaks."""
GIVE_UP = 60.0
"""Seconds connect-deadline waits for a ``connect()`` at most (the old one took 30)."""


@service("keep", dedup_window=60)
class Keep:
    """An echo whose replies are kept for repeats a minute long: what dedup-memory fills."""

    @handler
    def echo(self, x: Any) -> Any:
        return x


async def run_gateway() -> None:
    """The echo server, then the gateway routing to it (whose URL the driver reads)."""
    async with open_server(Echo, listen=LISTEN) as upstream:
        route = Route(public=ROUTE, upstream=upstream.url, address=ROUTE, allow=frozenset({APPS}))
        config = GatewayConfig(listen=LISTEN, routes=(route,), users=GATEWAY_USERS)
        async with open_gateway(config):
            await trio.sleep_forever()


def emit(**message: Any) -> None:
    print(json.dumps(message), flush=True)


async def timed(what: str, run: Callable[[], Awaitable[None]]) -> None:
    """One JSON line: ``what`` and its seconds, and the error it raised (if any)."""
    started = time.monotonic()
    error = ""
    try:
        with trio.fail_after(GIVE_UP):
            await run()
    except Exception as exc:  # what the client raised is the finding: reported, not raised
        error = f"{type(exc).__name__}: {exc}"
    emit(what=what, s=time.monotonic() - started, error=error)


async def _hold(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def connect_deadline() -> None:
    """``connect(url, timeout=2)`` against a listener that accepts and never speaks; then how
    long leaving ``connect()`` takes against a peer that opens but never answers a close."""
    from tests.client_peers import raw_server  # the tests' peer: what the client test uses

    async with trio.open_nursery() as nursery, raw_server(deaf_to_close=True) as deaf:
        mute = await nursery.start(functools.partial(trio.serve_tcp, _hold, 0, host="127.0.0.1"))
        url = f"amqp://127.0.0.1:{mute[0].socket.getsockname()[1]}"
        structlog.get_logger().info("server.listening", url=url)

        async def mute_connect() -> None:
            async with connect(url, timeout=DEADLINE):
                pass

        await timed("connect", mute_connect)
        left = 0.0

        async def deaf_close() -> None:
            nonlocal left
            async with connect(deaf.url, timeout=GIVE_UP, sasl=False):
                left = time.monotonic()

        await timed("open and leave", deaf_close)
        emit(what="leave", s=time.monotonic() - left if left else -1.0, error="")
        nursery.cancel_scope.cancel()


def _upstream_is_silent(
    _logger: object, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Drop the gateway's upstream echo server's listening line: the driver calls the
    gateway."""
    if event.get("event") == "server.listening":
        raise structlog.DropEvent
    return event


def main(name: str) -> None:
    log_to_stderr("INFO")
    if name == "bank":
        trio.run(functools.partial(serve, Bank, listen=LISTEN, users=BANK_USERS))
    elif name == "gateway":
        processors = structlog.get_config()["processors"]
        structlog.configure(processors=[_upstream_is_silent, *processors])
        trio.run(run_gateway)
    elif name == "connect-deadline":
        trio.run(connect_deadline)
    else:
        raise SystemExit(f"unknown host {name!r}")


if __name__ == "__main__":
    main(sys.argv[1])
