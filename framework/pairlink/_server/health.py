"""The health service every server answers, for container orchestrators and load balancers
(the wire form, and ``check_health``, the client side: :mod:`pairlink._client.health`).

It is an ordinary service of the container, so any AMQP 1.0 peer reaches it the way it reaches
the others (paired links, a reply link, or a dynamic node; ``amqp-value`` bodies), and the
server refuses a user's service at its address. Its actor has a mailbox of its own: probes
never take a user service's credit, and a service whose mailbox is full still reports
``serving``. It keeps answering through the graceful drain, so an orchestrator sees
``draining`` until the listener closes.
"""

from __future__ import annotations

from collections.abc import Collection

from pairlink._client.health import HEALTH, SERVING
from pairlink._rpc.wire import NOT_FOUND
from pairlink._server.service import handler, service
from pairlink.errors import CallError


@service(HEALTH, max_concurrency=4, mailbox=16)
class Health:
    """Reports the server's state: :data:`SERVING`, or :data:`DRAINING` once it stops."""

    def __init__(self, services: Collection[str]) -> None:
        self.services = services
        self.status = SERVING

    @handler
    async def check(self, service: str = "") -> dict[str, str]:
        """The server's status, or that of one of its services (``""``: the whole server);
        an unknown service is a 404, as gRPC answers NOT_FOUND."""
        if service and service not in self.services:
            raise CallError(NOT_FOUND, f"no service at the address {service!r}")
        return {"status": self.status}
