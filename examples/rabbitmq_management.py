"""Declare and delete queues, exchanges and bindings on RabbitMQ 4 over AMQP 1.0.

RabbitMQ 4 manages its topology through a node named ``/management`` that speaks HTTP over
AMQP (version 2 of its AMQP management protocol): a request carries the HTTP method in
``subject``, the percent-encoded path in ``to`` (``/queues/my-queue``, ``/exchanges/x``,
``/bindings``), ``reply-to: $me`` and an ``amqp-value`` body (a map, or null); the reply
carries ``correlation-id`` = the request's message-id, the HTTP status code as a string in
``subject`` and an ``amqp-value`` body (a map, a list, a null, or an explanation string for
an error). The node is reached through a paired link (OASIS Link Pairing: both halves named
alike, ``paired: true``, pre-settled), which is what pairlink's client opens on a broker that
offers ``LINK_PAIR_V1_0``, as RabbitMQ does.

Everything here is ``Client.request`` with the right subject, path and body:
``.venv/bin/python examples/rabbitmq_management.py`` talks to a broker on 127.0.0.1:5672
(``guest``/``guest``, which RabbitMQ allows from localhost only), declares a queue, an
exchange and a binding, reads the queue back, and removes them again.
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import quote

import trio

from pairlink import (
    AuthenticationError,
    Client,
    LinkDetachedError,
    PairlinkError,
    Reply,
    connect,
)

URL = "amqp://guest:guest@127.0.0.1:5672"
MANAGEMENT = "/management"


class ManagementError(Exception):
    """The management node answered with a status the operation does not expect."""

    def __init__(self, method: str, path: str, status: int | None, explanation: Any) -> None:
        super().__init__(f"{method} {path}: {status} {explanation}")
        self.status = status
        self.explanation = explanation


def segment(name: str) -> str:
    """A name as one path segment: everything but the unreserved characters of RFC 3986
    percent-encoded (a ``/`` too), as the management node decodes it."""
    return quote(name, safe="")


async def management(
    client: Client, method: str, path: str, body: Any = None, *, expect: tuple[int, ...]
) -> Reply:
    """One HTTP-over-AMQP request; the reply, if its status is one of ``expect``."""
    reply = await client.request(MANAGEMENT, body, subject=method, to=path)
    if reply.status not in expect:
        raise ManagementError(method, path, reply.status, reply.body)
    return reply


async def declare_queue(
    client: Client,
    name: str,
    *,
    durable: bool = True,
    exclusive: bool = False,
    auto_delete: bool = False,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create the queue, or find it as declared (a different declaration is a 409); returns
    what the broker says of it (``name``, ``type``, ``message_count``...)."""
    body = {
        "durable": durable,
        "exclusive": exclusive,
        "auto_delete": auto_delete,
        "arguments": arguments or {},
    }
    reply = await management(client, "PUT", f"/queues/{segment(name)}", body, expect=(200, 201))
    return dict(reply.body)


async def get_queue(client: Client, name: str) -> dict[str, Any] | None:
    """What the broker says of the queue; None if there is none of that name."""
    reply = await management(client, "GET", f"/queues/{segment(name)}", expect=(200, 404))
    return None if reply.status == 404 else dict(reply.body)


async def delete_queue(client: Client, name: str) -> int:
    """Delete the queue (deleting a missing one is no error); returns the messages it held."""
    reply = await management(client, "DELETE", f"/queues/{segment(name)}", expect=(200,))
    return int(reply.body["message_count"])


async def declare_exchange(
    client: Client, name: str, kind: str = "direct", *, durable: bool = True
) -> None:
    body = {"type": kind, "durable": durable, "auto_delete": False, "internal": False}
    await management(client, "PUT", f"/exchanges/{segment(name)}", body, expect=(201, 204))


async def delete_exchange(client: Client, name: str) -> None:
    await management(client, "DELETE", f"/exchanges/{segment(name)}", expect=(204,))


async def bind(client: Client, exchange: str, queue: str, key: str = "") -> str:
    """Bind ``queue`` to ``exchange`` with ``key``; returns the binding's path, for
    :func:`unbind` (a binding without arguments: their hash in the path is empty)."""
    body = {"source": exchange, "destination_queue": queue, "binding_key": key, "arguments": {}}
    await management(client, "POST", "/bindings", body, expect=(204,))
    return f"/bindings/src={segment(exchange)};dstq={segment(queue)};key={segment(key)};args="


async def unbind(client: Client, path: str) -> None:
    await management(client, "DELETE", path, expect=(204,))


async def tour(client: Client, queue: str = "pairlink demo queue") -> None:
    """Declare a queue, an exchange and a binding; read the queue back; remove them."""
    info = await declare_queue(client, queue, arguments={"x-queue-type": "classic"})
    print(f"declared queue {info['name']!r} ({info['type']}, {info['message_count']} messages)")
    await declare_exchange(client, "pairlink.demo")
    path = await bind(client, "pairlink.demo", queue, "demo-key")
    print(f"bound it to exchange 'pairlink.demo' with key 'demo-key': {path}")
    print(f"GET /queues/{segment(queue)} -> {await get_queue(client, queue)}")
    await unbind(client, path)
    await delete_exchange(client, "pairlink.demo")
    print(f"deleted queue {queue!r} holding {await delete_queue(client, queue)} messages")
    print(f"GET /queues/{segment(queue)} -> {await get_queue(client, queue)} (gone)")


async def main(url: str = URL) -> int:
    try:
        async with connect(url, timeout=10, connect_timeout=5) as client:
            await tour(client)
    except (AuthenticationError, LinkDetachedError, ManagementError) as exc:
        print(f"the broker at {url} refused: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (OSError, PairlinkError, TimeoutError) as exc:
        print(
            f"no RabbitMQ broker answers at {url} ({type(exc).__name__}: {exc}).\n"
            "Start one with: docker run --rm -p 5672:5672 rabbitmq:4",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
