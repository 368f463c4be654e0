"""A proxy for one service's calls: ``await proxy.add(1, 2)``, ``await proxy.map("score",
texts)``, with the call options kept apart from the operation's arguments."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from pairlink._client.batches import DEFAULT_IN_FLIGHT, Caller, OnError, map_calls, zipped
from pairlink._client.options import CallOptions
from pairlink._rpc.batch import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS
from pairlink._rpc.payload import Encoding


class ProxiedClient(Caller, Protocol):
    """What a proxy needs of its client (:class:`pairlink._client.client.Client`): its
    calls, with their options apart (``_call``), and its URL."""

    url: str

    async def _call(
        self,
        address: str,
        timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None,
        message_id: str | None,
        operation: str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any: ...


class ServiceProxy:
    """Calls to one service: ``await proxy.add(1, 2)`` or ``await proxy.call("add", 1, 2)``.

    Every keyword goes to the operation. The call's options travel apart: set for the
    proxy (``client.service("calc", timeout=5)``) or for some calls, on a copy:
    ``await proxy.options(timeout=5, message_id="job-7").add(1, 2)``. The names ``call``,
    ``map``, ``options``, ``client``, ``address`` and ``call_options`` are the proxy's own:
    an operation of one of those names is called as ``proxy.call("options", ...)``.
    """

    def __init__(self, client: ProxiedClient, address: str, call_options: CallOptions) -> None:
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

    async def call(self, operation: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call ``operation`` with these arguments, all of them the operation's."""
        options = self.call_options
        return await self.client._call(
            self.address,
            options.timeout,
            options.encoding,
            options.message_id,
            operation,
            *args,
            **kwargs,
        )

    async def map(
        self,
        operation: str,
        /,
        *iterables: Iterable[Any],
        in_flight: int = DEFAULT_IN_FLIGHT,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        on_error: OnError = "raise",
    ) -> list[Any]:
        """``operation`` called for each item, as the builtin ``map`` would (several
        iterables: their n-th items are the n-th call's arguments), its results in order.

        The calls go in batches, many to a message (``batch_rows`` rows or ``batch_bytes``
        bytes of arguments, whichever fills first; 256 and 256 KiB by default), at most
        ``in_flight`` batches outstanding, the iterables read as batches go; the service runs
        its handler for each row, or a vectorised handler once per batch. The proxy's
        ``timeout`` applies to each batch. ``on_error="raise"``: the first failed row's
        ``RemoteError`` is raised (the batches still out are cancelled); ``"return"``: it
        takes the row's place in the list. With the proxy's ``message_id``, batch ``n`` has
        the id ``<message_id>:<n>``: mapping the same rows again, a deduplicating service
        answers each batch it ran from its store."""
        options = self.call_options
        return await map_calls(
            self.client,
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

    def __getattr__(self, operation: str) -> Callable[..., Awaitable[Any]]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        options = self.call_options  # bound as ``call`` passes them: one coroutine less
        return functools.partial(
            self.client._call,
            self.address,
            options.timeout,
            options.encoding,
            options.message_id,
            operation,
        )

    def __repr__(self) -> str:
        return f"<ServiceProxy {self.address!r} on {self.client.url}>"
