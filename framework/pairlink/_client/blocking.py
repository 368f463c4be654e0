"""The client for plain synchronous code (scripts, Spark workers): the same calls, blocking.

One Trio run per process lives in a daemon thread, started on first use and shared by every
blocking client of the process; each call is handed to it with ``trio.from_thread`` and the
calling thread waits for the result, so any number of threads may call at once.

Forks are expected (Spark and multiprocessing fork their workers): a child inherits the
parent's memory but not its threads, and the parent's socket is still the parent's. So
everything here remembers the process it was made in; used in another process, it starts a
fresh Trio thread and a fresh connection there, and leaves the inherited ones alone (sending
even a ``close`` on the parent's socket would end the parent's connection).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

import trio

from pairlink._amqp.messaging import BodyKind, MessageId
from pairlink._client import client as aio
from pairlink._client.batches import DEFAULT_IN_FLIGHT, OnError, map_calls, zipped
from pairlink._client.options import CallOptions, ConnectOptions
from pairlink._client.reply import Reply
from pairlink._io.net import redacted
from pairlink._io.threads import TrioThread, start_trio_thread
from pairlink._rpc.batch import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS
from pairlink._rpc.payload import Encoding
from pairlink._telemetry.logs import get_logger
from pairlink.errors import ConnectionLostError

log = get_logger("pairlink.blocking")

CLOSE_TIMEOUT = 10.0

T = TypeVar("T")


_Portal = TrioThread[trio.Nursery]
"""The process's Trio thread; its value is the nursery of the connections it holds."""


async def _hold_nursery(*, task_status: trio.TaskStatus[trio.Nursery]) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


_portal: _Portal | None = None
_portal_lock = threading.Lock()


def _forget_portal() -> None:
    """In a forked child: the parent's Trio thread does not exist here, and a lock another
    parent thread held at the fork would stay held forever."""
    global _portal, _portal_lock
    _portal = None
    _portal_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_portal)


def _current_portal() -> _Portal:
    global _portal
    with _portal_lock:
        if _portal is None or not _portal.in_this_process:
            _portal = start_trio_thread(_hold_nursery, name="pairlink-trio")
        return _portal


class Client:
    """A blocking client: ``call``, ``service`` proxies and ``close``, as the async one."""

    def __init__(self, url: str | Sequence[str], **options: Unpack[ConnectOptions]) -> None:
        self.url = url if isinstance(url, str) else ",".join(url)
        self._endpoints = url if isinstance(url, str) else list(url)  # replicas: README
        self._options = options
        self._pid = -1
        self._client: aio.Client | None = None
        self._portal: _Portal | None = None
        self._stop: trio.Event | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._ensure()  # connect now: a bad URL or password fails here, not at the first call

    def _ensure(self) -> tuple[aio.Client, _Portal]:
        """The async client of this process; after a fork, a new one in a new Trio thread."""
        if self._closed:
            raise ConnectionLostError("the client is closed")
        if self._pid != os.getpid():
            self._lock = threading.Lock()  # the parent's may have been held at the fork
            self._pid = os.getpid()
            self._client = None
        with self._lock:
            if self._client is None or self._portal is None:
                portal = _current_portal()
                self._stopped = threading.Event()
                self._client, self._stop = portal.run(portal.value.start, self._hold, self._stopped)
                self._portal = portal
            return self._client, self._portal

    async def _hold(
        self,
        stopped: threading.Event,
        *,
        task_status: trio.TaskStatus[tuple[aio.Client, trio.Event]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the async client's context open in the portal until ``close``."""
        started = False
        try:
            async with aio.connect(self._endpoints, **self._options) as client:
                stop = trio.Event()
                task_status.started((client, stop))
                started = True
                await stop.wait()
        except Exception as exc:
            if not started:
                raise  # to the constructor (or the first call after a fork)
            log.warning("blocking.close_failed", url=redacted(self.url), error=repr(exc))
        finally:
            stopped.set()

    def _run(self, action: Callable[[aio.Client], Awaitable[T]]) -> T:
        """Run ``action(async client)`` in the Trio thread; block until it is done."""
        client, portal = self._ensure()
        return portal.run(action, client)

    def call(
        self,
        address: str,
        operation: str,
        /,
        *args: Any,
        timeout: float | None = None,
        encoding: Encoding | None = None,
        message_id: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **keywords: Any,
    ) -> Any:
        """``Client.call`` of the async client, blocking until the reply (or the error); the
        same options, and the same ``kwargs`` mapping for an operation's keywords that bear
        their names."""
        return self._run(
            lambda client: client.call(
                address,
                operation,
                *args,
                timeout=timeout,
                encoding=encoding,
                message_id=message_id,
                kwargs=kwargs,
                **keywords,
            )
        )

    def request(
        self,
        address: str,
        body: object = None,
        *,
        body_kind: BodyKind = "value",
        subject: str | None = None,
        to: str | None = None,
        application_properties: Mapping[str, object] | None = None,
        message_id: MessageId | None = None,
        correlation_id: MessageId | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Reply:
        """``Client.request`` of the async client, blocking until the whole reply (or the
        error)."""
        return self._run(
            lambda client: client.request(
                address,
                body,
                body_kind=body_kind,
                subject=subject,
                to=to,
                application_properties=application_properties,
                message_id=message_id,
                correlation_id=correlation_id,
                content_type=content_type,
                timeout=timeout,
            )
        )

    def service(
        self, address: str, *, timeout: float | None = None, encoding: Encoding | None = None
    ) -> ServiceProxy:
        """A blocking proxy for the service at ``address`` (see the async ``service``)."""
        self._run(lambda client: client.service(address))
        return ServiceProxy(self, address, CallOptions(timeout=timeout, encoding=encoding))

    def close(self) -> None:
        """Close this process's connection; idempotent. In a forked child that never used
        the client there is nothing of its own to close."""
        if self._closed:
            return
        self._closed = True
        stop, portal = self._stop, self._portal
        if self._pid != os.getpid() or stop is None or portal is None:
            return
        portal.run_sync(stop.set)
        self._stopped.wait(CLOSE_TIMEOUT)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()


class ServiceProxy:
    """Blocking calls to one service: ``proxy.add(1, 2)`` or ``proxy.call("add", 1, 2)``;
    every keyword goes to the operation, the options travel apart as in the async proxy:
    ``proxy.options(timeout=5).add(1, 2)``."""

    def __init__(self, client: Client, address: str, call_options: CallOptions) -> None:
        self.client = client
        self.address = address
        self.call_options = call_options

    def options(
        self,
        *,
        timeout: float | None = None,
        encoding: Encoding | None = None,
        message_id: str | None = None,
    ) -> ServiceProxy:
        """A proxy for the same service whose calls have these options (None: this
        proxy's)."""
        changed = self.call_options.evolve(timeout, encoding, message_id)
        return ServiceProxy(self.client, self.address, changed)

    def call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call ``operation`` with these arguments, all of them the operation's."""
        options = self.call_options
        return self.client.call(
            self.address,
            operation,
            *args,
            timeout=options.timeout,
            encoding=options.encoding,
            message_id=options.message_id,
            kwargs=kwargs,
        )

    def map(
        self,
        operation: str,
        /,
        *iterables: Iterable[Any],
        in_flight: int = DEFAULT_IN_FLIGHT,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        on_error: OnError = "raise",
    ) -> list[Any]:
        """The async proxy's ``map``, blocking until every row is answered (the iterables
        are read from the client's Trio thread)."""
        options = self.call_options
        return self.client._run(
            lambda client: map_calls(
                client,
                self.address,
                operation,
                zipped(iterables),
                timeout=options.timeout,
                message_id=options.message_id,
                in_flight=in_flight,
                batch_rows=batch_rows,
                batch_bytes=batch_bytes,
                on_error=on_error,
            )
        )

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return functools.partial(self.call, operation)

    def __repr__(self) -> str:
        return f"<blocking ServiceProxy {self.address!r} on {redacted(self.client.url)}>"


def connect(url: str | Sequence[str], **options: Unpack[ConnectOptions]) -> Client:
    """Connect now and return a blocking client; ``options`` as for ``pairlink.connect``.
    Use it as a context manager or call ``close()``."""
    return Client(url, **options)
