"""A classic Proton request-response client: what Proton's own examples do without pairing.

A sender to the service address and a receiver with a *dynamic* source; requests go out once
the peer has named the dynamic node (its address is the ``reply_to`` of every request), and the
run ends when every reply has come (or on timeout). Runs its own reactor in a thread, like the
peers of :mod:`tests.interop.proton_peers`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import attrs
from proton import Connection, Endpoint, Handler, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, DynamicNodeProperties

from tests.interop.proton_common import (
    DEFAULT_PREFETCH,
    PeerError,
    StopReactor,
    condition_text,
    outcome_of,
    run_reactor,
)


@attrs.define
class RpcResult:
    """What a :class:`ProtonRpcClient` run saw."""

    reply_address: str | None = None
    replies: list[Message] = attrs.field(factory=list)
    outcomes: list[str] = attrs.field(factory=list)
    error: str | None = None


class ProtonRpcClient(MessagingHandler):
    """Send ``requests`` to ``address`` with ``reply_to`` = our dynamic receiver's address,
    and collect one reply per request."""

    def __init__(
        self,
        url: str,
        address: str,
        requests: Sequence[Message],
        *,
        timeout: float = 10.0,
        container_id: str = "proton-rpc-client",
    ) -> None:
        super().__init__(prefetch=DEFAULT_PREFETCH, auto_accept=True)
        self.url = url
        self.address = address
        self.requests = list(requests)
        self.timeout = timeout
        self.result = RpcResult()
        self._conn: Connection | None = None
        self._sender: Any = None
        self._sent = 0
        self._timer: Any = None
        self._container = Container(self)
        self._container.container_id = container_id
        self._thread: threading.Thread | None = None
        self._crash: BaseException | None = None

    def run(self) -> RpcResult:
        """Run to completion (blocking: call it through ``trio.to_thread.run_sync``)."""
        self._thread = threading.Thread(target=self._run, name="proton-rpc", daemon=True)
        self._thread.start()
        self._thread.join(self.timeout + 10.0)
        if self._thread.is_alive():
            raise PeerError("the Proton RPC client did not finish")
        if self._crash is not None:
            raise PeerError("the Proton RPC client's reactor failed") from self._crash
        return self.result

    def _run(self) -> None:
        try:
            run_reactor(self._container)
        except BaseException as exc:
            self._crash = exc

    # -- reactor thread ----------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        container = event.container
        self._timer = container.schedule(self.timeout, _Timeout(self))
        self._conn = container.connect(self.url, reconnect=False)
        self._sender = container.create_sender(self._conn, self.address)
        container.create_receiver(self._conn, None, dynamic=True, options=DynamicNodeProperties({}))

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None and event.receiver.remote_source.dynamic:
            self.result.reply_address = event.receiver.remote_source.address
            self._send_ready(self._sender)

    def on_sendable(self, event: Any) -> None:
        self._send_ready(event.sender)

    def _send_ready(self, sender: Any) -> None:
        if self.result.reply_address is None or sender is None:
            return
        while sender.credit > 0 and self._sent < len(self.requests):
            request = self.requests[self._sent]
            request.reply_to = self.result.reply_address
            sender.send(request)
            self._sent += 1

    def on_accepted(self, event: Any) -> None:
        self.result.outcomes.append(outcome_of(event.delivery))

    on_rejected = on_accepted

    def on_message(self, event: Any) -> None:
        self.result.replies.append(event.message)
        if len(self.result.replies) >= len(self.requests):
            self._finish(None)

    def on_link_error(self, event: Any) -> None:
        self._finish(condition_text(event.link) or "link error")

    def on_transport_error(self, event: Any) -> None:
        self._finish(condition_text(event.transport) or "transport error")
        super().on_transport_error(event)

    def _finish(self, error: str | None) -> None:
        if error is not None and self.result.error is None:
            self.result.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self._conn
        if conn is not None and not conn.state & Endpoint.LOCAL_CLOSED:
            conn.close()


class _Timeout(Handler):
    def __init__(self, client: ProtonRpcClient) -> None:
        self.client = client

    def on_timer_task(self, event: Any) -> None:
        self.client._timer = None
        self.client._finish("timeout")
        event.container.schedule(2.0, StopReactor())
