"""The HTTP endpoint Prometheus scrapes: a registry served from the event loop, each request
parsed by h11.

Monitoring must survive its own port: a socket that connects and says nothing, or half a
request, must not lock scrapes out. So the endpoint holds at most ``MAX_CONNECTIONS`` sockets,
and when full it drops the oldest one still sending its request (a scraper sends its whole
request at once, so the one waiting longest is the one least likely to be a scraper); a
request head must arrive within ``HEAD_TIMEOUT``, and the answer must be taken within
``SEND_TIMEOUT``. The registry is rendered on the event loop, one scrape at a time.

Imported only once metrics are asked for (:func:`pairlink._telemetry.metrics.prometheus` has
checked that h11 and ``prometheus_client``, the ``metrics`` extra, are installed).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import h11
import trio

from pairlink._telemetry.metrics import log, parse_listen, prometheus

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

MAX_CONNECTIONS = 64
"""Sockets the endpoint holds at once; past it, the oldest still sending its request makes
room (none: the new one is closed, and Prometheus retries)."""
HEAD_TIMEOUT = 2.0
"""Seconds a scraper has to send its request head (Prometheus sends it at once)."""
SEND_TIMEOUT = 10.0
"""Seconds a scraper has to take the answer (a slow reader is not held forever)."""
MAX_REQUEST_HEAD = 8192
"""Bytes of an HTTP request's head (request line and headers) the endpoint reads at most."""


async def serve_metrics(
    listen: str,
    registry: CollectorRegistry,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` over HTTP at ``listen`` (``HOST:PORT``) until cancelled;
    ``task_status.started`` gets the URL to scrape (the real port when asked for port 0).

    Any path answers the metrics (Prometheus asks for ``/metrics``), in the format the
    scraper's ``Accept`` header chooses (text, or OpenMetrics)."""
    host, port = parse_listen(listen)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}/metrics"
    endpoint = _Endpoint(registry)
    log.info("metrics.listening", url=url)
    async with trio.open_nursery() as nursery:
        task_status.started(url)
        await trio.serve_listeners(endpoint.answer, listeners, handler_nursery=nursery)


class _Endpoint:
    """The endpoint's sockets: those still sending their request (oldest first), and how many
    are being answered."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.heads: dict[trio.CancelScope, None] = {}
        self.answering = 0

    async def answer(self, stream: trio.SocketStream) -> None:
        """One HTTP exchange (parsed by h11): read the request, answer it, close."""
        async with stream:
            if len(self.heads) + self.answering >= MAX_CONNECTIONS and not self._make_room():
                return
            http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
            request = None
            scope = trio.move_on_after(HEAD_TIMEOUT)
            self.heads[scope] = None
            try:
                with scope:
                    request = await _read_request(stream, http)
            finally:
                self.heads.pop(scope, None)
            if request is None:
                if http.their_state is h11.ERROR:  # malformed or too long: say so, then close
                    await _send(stream, http, 400, "text/plain", b"bad request\n")
                return
            self.answering += 1
            try:
                with trio.move_on_after(SEND_TIMEOUT):
                    await self._respond(stream, http, request)
            finally:
                self.answering -= 1

    def _make_room(self) -> bool:
        """Drop the oldest socket still sending its request; False if none is."""
        for oldest in self.heads:
            del self.heads[oldest]
            oldest.cancel()
            return True
        return False

    async def _respond(
        self, stream: trio.SocketStream, http: h11.Connection, request: h11.Request
    ) -> None:
        if request.method != b"GET":
            await _send(stream, http, 405, "text/plain", b"GET only\n")
            return
        accept = b", ".join(value for name, value in request.headers if name == b"accept")
        encode, content_type = prometheus().exposition.choose_encoder(accept.decode("latin-1"))
        try:
            body: bytes = encode(self.registry)
        except Exception as exc:  # a collector's bug fails this scrape, not the server
            log.error("metrics.scrape_failed", error=repr(exc), exc_info=exc)
            await _send(stream, http, 500, "text/plain", b"scrape failed\n")
            return
        await _send(stream, http, 200, content_type, body)


async def _read_request(stream: trio.SocketStream, http: h11.Connection) -> h11.Request | None:
    """The request's head, or None when the scraper left or sent something h11 refuses."""
    while True:
        try:
            event = http.next_event()
        except h11.RemoteProtocolError:
            return None
        if isinstance(event, h11.Request):
            return event
        if event is not h11.NEED_DATA:  # closed before a request
            return None
        try:
            http.receive_data(await stream.receive_some(MAX_REQUEST_HEAD))
        except trio.BrokenResourceError:
            return None


async def _send(
    stream: trio.SocketStream, http: h11.Connection, status: int, content_type: str, body: bytes
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    data = http.send(h11.Response(status_code=status, headers=headers)) or b""
    data += (http.send(h11.Data(data=body)) or b"") + (http.send(h11.EndOfMessage()) or b"")
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):  # it left
        await stream.send_all(data)
