"""Many calls of one operation as pipelined batches (:mod:`pairlink._rpc.batch`): what
``proxy.map`` does, and the batch call Spark's tasks make.

Rows are packed as they are read from the caller's iterable, so a long or endless one is never
held whole: at most ``in_flight`` batches are outstanding, and the results come back in the
rows' order. To a peer that is not pairlink (it offers no call envelope: a Proton or rhea
service), each row goes as a call of its own, pipelined as well.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import trio

from pairlink._io.taskgroups import lone_errors_unwrapped
from pairlink._rpc import batch
from pairlink._rpc.batch import ALONE, DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS, Row, Rows
from pairlink._rpc.payload import Encoding
from pairlink.errors import RemoteError


class Caller(Protocol):
    """What batches need of a client (:class:`pairlink._client.client.Client`)."""

    @property
    def call_encoding(self) -> Encoding | None: ...

    async def call(
        self,
        address: str,
        operation: str,
        /,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None = None,
        message_id: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **keywords: Any,
    ) -> Any: ...


OnError = Literal["raise", "return"]

DEFAULT_IN_FLIGHT = 8
"""Batches ``map`` keeps outstanding unless told otherwise: enough to keep a service's workers
and the connection busy while replies travel (8 x 256 rows), few enough that one caller's map
leaves most of a service's mailbox (128 by default) to others."""


def check_batching(in_flight: int, batch_rows: int, batch_bytes: int) -> None:
    """``ValueError`` unless the three are ints >= 1."""
    for name, value in (
        ("in_flight", in_flight),
        ("batch_rows", batch_rows),
        ("batch_bytes", batch_bytes),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, not {value!r}")


async def call_batch(
    client: Caller,
    address: str,
    operation: str,
    rows: Rows,
    *,
    timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
    message_id: str | None,
) -> list[object]:
    """One batch as one call: each row's value, or the ``RemoteError`` it failed with. A
    failure of the whole batch (404, 408 before it ran, 400) is each row's."""
    try:
        value = await client.call(
            address,
            operation,
            rows.body,
            timeout=timeout,
            encoding=Encoding.BATCH,
            message_id=message_id,
        )
    except RemoteError as exc:
        return [exc] * rows.count
    return batch.results(value, rows.count)


async def map_calls(
    client: Caller,
    address: str,
    operation: str,
    rows: Iterable[Row],
    *,
    timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
    message_id: str | None = None,
    in_flight: int = DEFAULT_IN_FLIGHT,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    on_error: OnError = "raise",
) -> list[Any]:
    """Every row's result, in order, calling ``operation`` in batches (see ``proxy.map``).
    ``message_id``: the batches' ids are ``<message_id>:<n>`` (n from 0), the same when
    the same rows are mapped again, so a deduplicating service runs each batch once."""
    check_batching(in_flight, batch_rows, batch_bytes)
    if on_error not in ("raise", "return"):
        raise ValueError(f'on_error must be "raise" or "return", not {on_error!r}')
    if client.call_encoding not in (None, Encoding.ENVELOPE):
        batch_rows = 1  # a peer of another stack: each row a call of its own
    results: list[Any] = []
    limiter = trio.Semaphore(in_flight)

    async def run(rows: Rows, start: int, number: int, row: Row | None) -> None:
        mid = None if message_id is None else f"{message_id}:{number}"
        try:
            if row is None:
                values = await call_batch(
                    client, address, operation, rows, timeout=timeout, message_id=mid
                )
            else:
                values = [await _single(client, address, operation, row, timeout, mid)]
        finally:
            limiter.release()
        results[start : start + len(values)] = values
        if on_error == "raise":
            for value in values:
                if isinstance(value, RemoteError):
                    raise value

    with lone_errors_unwrapped():
        async with trio.open_nursery() as nursery:
            for number, (packed, row) in enumerate(_batches(rows, batch_rows, batch_bytes)):
                await limiter.acquire()
                start = len(results)
                results.extend(itertools.repeat(None, packed.count))
                nursery.start_soon(run, packed, start, number, row)
    return results


def _batches(
    rows: Iterable[Row], batch_rows: int, batch_bytes: int
) -> Iterable[tuple[Rows, Row | None]]:
    """The batches to send; with ``batch_rows`` 1, each row as itself (a single call)."""
    if batch_rows > 1:
        return ((packed, None) for packed in batch.packed(rows, batch_rows, batch_bytes))
    return ((ALONE, row) for row in rows)


async def _single(
    client: Caller,
    address: str,
    operation: str,
    row: Row,
    timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
    message_id: str | None,
) -> object:
    args, kwargs = row
    try:
        return await client.call(
            address, operation, *args, timeout=timeout, message_id=message_id, kwargs=kwargs
        )
    except RemoteError as exc:
        return exc


def zipped(iterables: Sequence[Iterable[Any]]) -> Iterable[tuple[Sequence[Any], Mapping[str, Any]]]:
    """``map``'s rows from its iterables, as the builtin ``map`` takes them: the n-th items
    together are the n-th call's positional arguments."""
    return ((args, {}) for args in zip(*iterables, strict=False))
