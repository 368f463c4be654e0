"""Proton clients: a MessagingHandler in a thread, and BlockingConnection helpers (see
:mod:`tests.interop.proton_peers`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from proton import (
    Connection,
    Delivery,
    Endpoint,
    Handler,
    Link,
    Message,
    symbol,
)
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from tests.interop.proton_common import (
    DEFAULT_PREFETCH,
    TLS_SERVER_NAME,
    Outcome,
    PeerError,
    StopReactor,
    client_ssl_domain,
    condition_text,
    outcome_of,
    run_reactor,
    symbol_names,
)
from tests.tls import TlsFiles

# ---------------------------------------------------------------------------------------------
# Client: MessagingHandler in a thread


@attrs.define
class ClientResult:
    """What a :class:`ProtonClient` run saw."""

    outcomes: list[Outcome | None]
    """The peer's outcome for each sent message, in send order (None: none came)."""
    received: list[Message]
    error: str | None
    """The first transport/connection/link error, ``"condition: description"``, or "timeout"."""
    remote_container: str | None = None
    remote_offered_capabilities: list[str] = attrs.field(factory=list)
    remote_properties: dict[Any, Any] | None = None


class ProtonClient(MessagingHandler):
    """A Proton client: connect, attach, send ``messages`` to ``send_to`` (collecting every
    disposition) and/or receive ``expect`` messages from ``receive_from``, then close.

    ``link_name`` names both links alike and ``link_properties`` goes on both attaches:
    ``link_name="n", link_properties={"paired": True}`` makes them a link pair.

    Runs its own container in a thread: :meth:`start` then :meth:`wait`, or :func:`run_client`.
    """

    def __init__(
        self,
        url: str,
        *,
        send_to: str | None = None,
        messages: Sequence[Message] = (),
        receive_from: str | None = None,
        expect: int = 0,
        user: str | None = None,
        password: str | None = None,
        mechanisms: str | None = None,
        tls: TlsFiles | None = None,
        client_cert: bool = False,
        sni: str = TLS_SERVER_NAME,
        idle_timeout: float | None = None,
        virtual_host: str | None = None,
        container_id: str = "proton-client",
        desired_capabilities: Sequence[str] = (),
        link_name: str | None = None,
        link_properties: Mapping[str, Any] | None = None,
        presettled: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(prefetch=prefetch, auto_accept=True)
        self.url = url
        self.send_to = send_to
        self.messages = list(messages)
        self.receive_from = receive_from
        self.expect = expect
        self.connect_kwargs: dict[str, Any] = {
            "reconnect": False,
            "allow_insecure_mechs": True,
            "heartbeat": idle_timeout,
        }
        if user is not None:
            self.connect_kwargs.update(user=user, password=password)
        if mechanisms is not None:
            self.connect_kwargs["allowed_mechs"] = mechanisms
        if tls is not None:
            self.connect_kwargs["ssl_domain"] = client_ssl_domain(tls, client_cert=client_cert)
            self.connect_kwargs["sni"] = sni
        if virtual_host is not None:
            self.connect_kwargs["virtual_host"] = virtual_host
        if desired_capabilities:
            self.connect_kwargs["desired_capabilities"] = [symbol(c) for c in desired_capabilities]
        self.link_name = link_name
        self.link_properties = {symbol(k): v for k, v in (link_properties or {}).items()}
        self.presettled = presettled
        self.timeout = timeout
        self.result = ClientResult(outcomes=[None] * len(self.messages), received=[], error=None)
        self._sent = 0
        self._settled = 0
        self._deliveries: dict[Delivery, int] = {}
        self._conn: Connection | None = None
        self._timer: Any = None
        self._container = Container(self)
        self._container.container_id = container_id
        self._thread: threading.Thread | None = None
        self._crash: BaseException | None = None

    # -- test thread

    def start(self) -> ProtonClient:
        self._thread = threading.Thread(target=self._run, name="proton-client", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            run_reactor(self._container)
        except BaseException as exc:
            self._crash = exc

    def wait(self, timeout: float | None = None) -> ClientResult:
        """Wait for the run to end (its own ``timeout`` plus a margin) and return its result."""
        assert self._thread is not None, "start() first"
        self._thread.join(self.timeout + 10.0 if timeout is None else timeout)
        if self._thread.is_alive():
            raise PeerError("Proton client thread did not finish")
        if self._crash is not None:
            raise PeerError("the Proton client's reactor failed") from self._crash
        return self.result

    # -- reactor thread

    def on_start(self, event: Any) -> None:
        container = event.container
        self._timer = container.schedule(self.timeout, _ClientTimeout(self))
        self._conn = container.connect(self.url, **self.connect_kwargs)
        options = _LinkProperties(self.link_properties) if self.link_properties else None
        if self.send_to is not None:
            container.create_sender(self._conn, self.send_to, name=self.link_name, options=options)
        if self.receive_from is not None:
            container.create_receiver(
                self._conn, self.receive_from, name=self.link_name, options=options
            )
        self._maybe_finish()

    def on_connection_opened(self, event: Any) -> None:
        conn = event.connection
        self.result.remote_container = conn.remote_container
        self.result.remote_offered_capabilities = symbol_names(conn.remote_offered_capabilities)
        self.result.remote_properties = (
            dict(conn.remote_properties) if conn.remote_properties else None
        )

    def on_sendable(self, event: Any) -> None:
        link = event.link
        while link.credit > 0 and self._sent < len(self.messages):
            index = self._sent
            delivery = link.send(self.messages[index])
            self._sent += 1
            if self.presettled:
                delivery.settle()
                self._settled += 1
            else:
                self._deliveries[delivery] = index
        self._maybe_finish()

    def _outcome(self, event: Any) -> None:
        index = self._deliveries.pop(event.delivery, None)
        if index is None:
            return
        self.result.outcomes[index] = outcome_of(event.delivery)
        self._settled += 1
        self._maybe_finish()

    on_accepted = on_rejected = on_released = on_settled = _outcome

    def on_message(self, event: Any) -> None:
        self.result.received.append(event.message)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._settled >= len(self.messages) and len(self.result.received) >= self.expect:
            self._finish(None)

    def _finish(self, error: str | None) -> None:
        if error is not None and self.result.error is None:
            self.result.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self._conn
        if conn is not None and not conn.state & Endpoint.LOCAL_CLOSED:
            conn.close()

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        self._finish(f"{cond.name}: {cond.description}" if cond else "transport error")
        super().on_transport_error(event)

    def on_connection_error(self, event: Any) -> None:
        self._finish(condition_text(event.connection) or "connection error")

    def on_session_error(self, event: Any) -> None:
        self._finish(condition_text(event.session) or "session error")

    def on_link_error(self, event: Any) -> None:
        self._finish(condition_text(event.link) or "link error")

    def on_connection_closing(self, event: Any) -> None:
        # The peer closed first: remember why (if it said), and answer.
        if event.connection.remote_condition is not None:
            self._finish(condition_text(event.connection))

    def on_link_closing(self, event: Any) -> None:
        if event.link.remote_condition is not None:
            self._finish(condition_text(event.link))

    def on_disconnected(self, event: Any) -> None:
        # Proton may report the disconnect before the transport error that caused it: the
        # transport's condition (a SASL refusal, say) is the real reason, so it wins.
        cond = event.transport.condition if event.transport is not None else None
        if cond:
            self._finish(f"{cond.name}: {cond.description}")
        elif self._settled < len(self.messages) or len(self.result.received) < self.expect:
            self._finish("disconnected")


class _ClientTimeout(Handler):
    def __init__(self, client: ProtonClient) -> None:
        self.client = client

    def on_timer_task(self, event: Any) -> None:
        self.client._timer = None
        self.client._finish("timeout")
        event.container.schedule(2.0, StopReactor())


class _LinkProperties:
    """A Proton ``LinkOption``: attach properties (``{paired: true}`` for a paired link)."""

    def __init__(self, properties: dict[Any, Any]) -> None:
        self.properties = properties

    def apply(self, link: Link) -> None:
        link.properties = self.properties

    def test(self, link: Link) -> bool:
        return True


def run_client(url: str, **kwargs: Any) -> ClientResult:
    """Run a :class:`ProtonClient` to completion (blocking; from Trio use
    ``trio.to_thread.run_sync(functools.partial(run_client, url, ...))``)."""
    return ProtonClient(url, **kwargs).start().wait()


# ---------------------------------------------------------------------------------------------
# Client: BlockingConnection


def open_blocking(
    url: str,
    *,
    user: str | None = None,
    password: str | None = None,
    mechanisms: str | None = None,
    tls: TlsFiles | None = None,
    client_cert: bool = False,
    sni: str = TLS_SERVER_NAME,
    idle_timeout: float | None = None,
    container_id: str | None = None,
    timeout: float = 30.0,
) -> BlockingConnection:
    """A ``BlockingConnection`` with the same options as :class:`ProtonClient`."""
    kwargs: dict[str, Any] = {"allow_insecure_mechs": True}
    if tls is not None:
        kwargs["sni"] = sni
    if user is not None:
        kwargs.update(user=user, password=password)
    if mechanisms is not None:
        kwargs["allowed_mechs"] = mechanisms
    container = Container()
    if container_id is not None:
        container.container_id = container_id
    return BlockingConnection(
        url,
        timeout=timeout,
        container=container,
        ssl_domain=client_ssl_domain(tls, client_cert=client_cert) if tls else None,
        heartbeat=idle_timeout,
        reconnect=False,
        **kwargs,
    )


def blocking_send(
    url: str, address: str, messages: Iterable[Message], **kwargs: Any
) -> list[Outcome]:
    """Send each message and wait for its settlement (``BlockingSender.send``); return outcomes.

    ``kwargs`` go to :func:`open_blocking`. An outcome other than accepted is returned, not
    raised, so a test can assert on it.
    """
    conn = open_blocking(url, **kwargs)
    try:
        sender = conn.create_sender(address)
        return [outcome_of(sender.send(m, error_states=[])) for m in messages]
    finally:
        conn.close()


def blocking_receive(
    url: str, address: str, count: int, *, credit: int = DEFAULT_PREFETCH, **kwargs: Any
) -> list[Message]:
    """Receive and accept ``count`` messages from ``address`` (``BlockingReceiver``)."""
    timeout = kwargs.get("timeout", 30.0)
    conn = open_blocking(url, **kwargs)
    try:
        receiver = conn.create_receiver(address, credit=credit)
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            out.append(receiver.receive(timeout=max(0.1, deadline - time.monotonic())))
            receiver.accept()
        return out
    finally:
        conn.close()
