"""What the Proton server and client of the interop harness share: outcomes, TLS domains,
the reactor loop, test messages. Import from :mod:`tests.interop.proton_peers`."""

from __future__ import annotations

from typing import Any, Literal

from proton import (
    Delivery,
    Handler,
    Message,
    SSLDomain,
)
from proton.reactor import Container

from tests.tls import TlsFiles

LOOPBACK = "127.0.0.1"
DEFAULT_PREFETCH = 1000
"""Credit a Proton receiver keeps granting. MessagingHandler's default of 10 starves a fast peer."""

REACTOR_WAKEUP = 0.2
"""Longest wait of a reactor in select(). Proton's default is pi seconds, and a reactor whose
last socket closed while a (cancelled) timer was pending sleeps that long before it ends."""

Outcome = Literal["accepted", "rejected", "released", "modified", "received", "settled"]
Disposition = Literal["accept", "reject", "release", "modify"]

_STATE_NAMES: dict[int, Outcome] = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
    Delivery.RECEIVED: "received",
}


def outcome_of(delivery: Delivery) -> Outcome:
    """The peer's outcome for one of our deliveries ("settled" if it settled with no state)."""
    return _STATE_NAMES.get(delivery.remote_state, "settled")


class PeerError(RuntimeError):
    """A Proton peer failed: a timeout, an exception in its reactor thread, a refused setup."""


# ---------------------------------------------------------------------------------------------
# TLS


def server_ssl_domain(tls: TlsFiles, *, require_client_cert: bool = False) -> SSLDomain:
    """Proton's server-side TLS configuration from the trustme files."""
    domain = SSLDomain(SSLDomain.MODE_SERVER)
    domain.set_credentials(str(tls.server_cert), str(tls.server_key), None)
    if require_client_cert:
        domain.set_trusted_ca_db(str(tls.ca_cert))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER, str(tls.ca_cert))
    else:
        domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
    return domain


TLS_SERVER_NAME = "localhost"
"""The name a Proton client checks the server certificate against. Proton matches DNS names
(subjectAltName dNSName, then the CN) but not IP addresses, so connecting to ``127.0.0.1`` with
VERIFY_PEER_NAME fails unless the name to check is given separately (the ``sni`` connect
option): our test certificates name both ``localhost`` and ``127.0.0.1``."""


def client_ssl_domain(tls: TlsFiles, *, client_cert: bool = False) -> SSLDomain:
    """Proton's client-side TLS configuration: trust the test CA and check the server's name."""
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(tls.ca_cert))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(tls.ca_cert))
    if client_cert:
        domain.set_credentials(str(tls.client_cert), str(tls.client_key), None)
    return domain


# ---------------------------------------------------------------------------------------------
# Reactor plumbing


def run_reactor(container: Container) -> None:
    # Container.run() with a shorter select() wait (run() hard-codes pi seconds).
    container.timeout = REACTOR_WAKEUP
    container.start()
    while container.process():
        pass
    container.stop()
    container.process()


def condition_text(*endpoints: Any) -> str | None:
    for endpoint in endpoints:
        cond = getattr(endpoint, "remote_condition", None) or getattr(endpoint, "condition", None)
        if cond is not None:
            return f"{cond.name}: {cond.description}"
    return None


def symbol_names(values: Any) -> list[str]:
    return [str(v) for v in values] if values else []


class StopReactor(Handler):
    def on_timer_task(self, event: Any) -> None:
        event.container.stop()


# ---------------------------------------------------------------------------------------------
# Messages


def make_messages(
    count: int,
    *,
    big_index: int | None = None,
    big_size: int = 1 << 20,
    address: str | None = None,
    reply_to: str | None = None,
) -> list[Message]:
    """``count`` messages with ids ``m-<i>`` and small ``data`` bodies; ``big_index`` gets a
    body of ``big_size`` bytes (1 MiB: many frames at any usual max-frame-size)."""
    messages = []
    for i in range(count):
        size = big_size if i == big_index else 64
        body = (i.to_bytes(4, "big") * (size // 4 + 1))[:size]
        msg = Message(
            body=body,
            id=f"m-{i}",
            address=address,
            reply_to=reply_to,
            inferred=True,
            properties={"index": i},
        )
        messages.append(msg)
    return messages
