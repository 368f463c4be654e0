"""The health service every server answers, for container orchestrators and load balancers
(the wire form, and ``check_health``, the client side: :mod:`pairlink._client.health`).

It is an ordinary service of the container, so any AMQP 1.0 peer reaches it the way it reaches
the others (paired links, a reply link, or a dynamic node; ``amqp-value`` bodies), and the
server refuses a user's service at its address. Its actor has a mailbox of its own: probes
never take a user service's credit, and a service whose mailbox is full still reports
``serving``. It keeps answering through the graceful drain, so an orchestrator sees
``draining`` until the listener closes.

Asked about one service, it also tells whether that service's callers wait for credit: past
:data:`pairlink._server.mailbox.STARVED_AFTER`, the answer carries ``waiting_for_credit``
(seconds, the longest wait) and ``credit_holders`` (who holds the most credit), as the log's
``credit.starved`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import trio

from pairlink._client.health import HEALTH, SERVING
from pairlink._rpc.wire import NOT_FOUND
from pairlink._server.service import handler, service
from pairlink.errors import CallError


class CreditWaits(Protocol):
    """What the health service reads of a service's mailbox."""

    def starved(self, now: float) -> tuple[float, list[str]] | None: ...


@service(HEALTH, max_concurrency=4, mailbox=16)
class Health:
    """Reports the server's state: :data:`SERVING`, or :data:`DRAINING` once it stops."""

    def __init__(self, services: Mapping[str, CreditWaits]) -> None:
        self.services = services
        self.status = SERVING

    @handler
    async def check(self, service: str = "") -> dict[str, object]:
        """The server's status, or that of one of its services (``""``: the whole server);
        an unknown service is a 404, as gRPC answers NOT_FOUND."""
        if not service:
            return {"status": self.status}
        mailbox = self.services.get(service)
        if mailbox is None:
            raise CallError(NOT_FOUND, f"no service at the address {service!r}")
        starved = mailbox.starved(trio.current_time())
        if starved is None:
            return {"status": self.status}
        waited, holders = starved
        return {
            "status": self.status,
            "waiting_for_credit": round(waited, 1),
            "credit_holders": holders,
        }
