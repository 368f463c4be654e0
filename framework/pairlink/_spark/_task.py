"""The worker side of a fan-out: one Spark task's rows as pipelined calls on one client.

Spark hands a task's rows to a plain generator (``mapInArrow`` and ``mapPartitions`` both take
an iterator and want one back), and the generator must yield its results from the thread that
called it. Trio therefore runs in a thread of its own for the task's lifetime (``trio.run`` per
task, so nothing is left behind when a task fails or the worker is reused): it reads the input
chunks (Arrow batches, or slices of an RDD partition) from a helper thread, calls the service
for the rows of each chunk in batches (:mod:`pairlink._rpc.batch`: ``batch_rows`` rows or
``batch_bytes`` bytes to a message, each row answered on its own) with at most ``in_flight``
messages outstanding, and hands each chunk back, in input order, once all its rows are
answered. The generator only waits for finished chunks; at most
``CHUNKS_AHEAD`` chunks are in progress, so a partition is never gathered whole.

The client is made here, inside the task, never shipped from the driver: Python workers fork,
and a connection belongs to one process. A lost connection is re-established with backoff (the
client's ``reconnect``) and each unanswered batch is sent again with the same message-id, so a
deduplicating service answers a batch that did run from its store instead of running it twice.
A batch's id derives from its rows' keys (:func:`batch_id`), and a chunk's rows are cut into
the same batches whenever they are read (:func:`pairlink._rpc.batch.packed`): a retried task's
batches have the ids of the first attempt's.
Given several replicas, the one client holds a connection to each and places every call on the
ready one with the most free credit; a call lost with its replica is sent again, with its id,
to a replica that is ready (README, "Replicas: one client, several service processes").
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Generic, Literal, TypeVar, cast

import attrs
import trio

from pairlink._client.batches import call_batch
from pairlink._client.client import Client, connect
from pairlink._io.taskgroups import lone_errors_unwrapped
from pairlink._io.threads import start_trio_thread
from pairlink._rpc.batch import ALONE, DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS, Row, Rows, packed
from pairlink._spark._reporter import Counts, report
from pairlink._spark._tls import Security
from pairlink._spark._urls import described, scrubbed
from pairlink._telemetry.logs import get_logger
from pairlink.errors import ConnectionLostError, PairlinkError, RemoteError

log = get_logger("pairlink.spark")

P = TypeVar("P")
OnError = Literal["raise", "column"]

CHUNKS_AHEAD = 2
"""Chunks read ahead of the one being answered: enough to keep ``in_flight`` calls going across
a chunk boundary, few enough that a task's memory stays a few chunks."""


@attrs.frozen
class Plan:
    """Everything a task needs to make its calls; pickled into the Spark closure."""

    url: str | tuple[str, ...]
    """One URL, or the replicas' (``connect`` takes either)."""
    address: str
    operation: str
    in_flight: int
    timeout: float
    on_error: OnError
    run_id: str
    connect_timeout: float
    progress_url: str | None = None
    security: Security = attrs.field(factory=Security)
    batch_rows: int = DEFAULT_BATCH_ROWS
    """Rows to a message at most (1: each row a call of its own)."""
    batch_bytes: int = DEFAULT_BATCH_BYTES


@attrs.define(eq=False)
class Chunk(Generic[P]):
    """A slice of a task's input and its answers: ``values[i]`` (None if row ``i`` failed),
    ``errors[i]`` (None if it succeeded)."""

    payload: P
    args: list[tuple[object, ...]]  # each row's call arguments
    ids: list[str] | None  # the message-ids from the rows' keys, None: numbered per task
    values: list[object] = attrs.field(init=False)  # each row's call result
    errors: list[str | None] = attrs.field(init=False)
    left: int = attrs.field(init=False)
    done: trio.Event = attrs.field(init=False, factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self.values = [None] * len(self.args)
        self.errors = [None] * len(self.args)
        self.left = len(self.args)


class _Calls(Generic[P]):
    """One task's Trio side: the connection, the in-flight bound, the ordered output."""

    def __init__(self, plan: Plan, reader: Callable[[], Chunk[P] | None]) -> None:
        self.plan = plan
        self.reader = reader
        self.counts = Counts()
        self.failure: BaseException | None = None
        self.prefix = f"{plan.run_id}:{uuid.uuid4().hex}:"  # ids of rows without a key
        self.sequence = 0
        self.scope = trio.CancelScope()
        self.out_send, self.out_recv = trio.open_memory_channel[Chunk[P]](0)

    async def main(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The task's calls, in the Trio thread; started at once (the Spark thread then waits
        on ``out_recv``). A lone failure is raised as itself, not in nested groups."""
        task_status.started()
        with lone_errors_unwrapped():
            await self._main()

    async def _main(self) -> None:
        plan = self.plan
        connected = False
        with self.scope:
            async with self.out_send:
                try:
                    async with connect(
                        plan.url,
                        timeout=plan.timeout,
                        reconnect=True,
                        connect_timeout=plan.connect_timeout,
                        reply_credit=max(2, 2 * plan.in_flight),
                        ssl_context=plan.security.ssl_context(),
                        sasl=plan.security.sasl,
                    ) as client:
                        connected = True
                        await self._run(client)
                except (OSError, TimeoutError) as exc:
                    if connected:
                        raise
                    where = described(plan.url)
                    why = scrubbed(str(exc), plan.url)
                    raise ConnectionLostError(
                        f"cannot reach the service {plan.address!r} at {where}: {why}"
                    ) from None  # its message may hold a password: redacted above
        if self.failure is not None:
            raise self.failure

    async def _run(self, client: Client) -> None:
        limiter = trio.Semaphore(self.plan.in_flight)
        pending_send, pending_recv = trio.open_memory_channel[Chunk[P]](CHUNKS_AHEAD)
        emitted = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._emit, pending_recv, emitted)
            if self.plan.progress_url is not None:
                nursery.start_soon(
                    report, self.plan.progress_url, self.plan.run_id, self.counts, emitted
                )
            async with pending_send:
                # abandoned if cancelled: the reader may wait on an input nobody will finish
                read = functools.partial(
                    trio.to_thread.run_sync, self.reader, abandon_on_cancel=True
                )
                while (chunk := await read()) is not None:
                    await pending_send.send(chunk)
                    if not chunk.args:
                        chunk.done.set()
                    start = 0
                    for rows in self._batches(chunk):
                        await limiter.acquire()
                        nursery.start_soon(self._batch, client, chunk, start, rows, limiter)
                        start += rows.count

    async def _emit(
        self, pending: trio.MemoryReceiveChannel[Chunk[P]], emitted: trio.Event
    ) -> None:
        """Hand chunks to the Spark thread in input order, each once all its rows are in."""
        async with pending:
            async for chunk in pending:
                await chunk.done.wait()
                await self.out_send.send(chunk)
        emitted.set()

    def _batches(self, chunk: Chunk[P]) -> list[Rows]:
        """A chunk's rows as the batches to send (batches of one: the rows' own calls)."""
        if self.plan.batch_rows == 1:
            return [ALONE] * len(chunk.args)
        rows: Iterator[Row] = ((args, {}) for args in chunk.args)
        return list(packed(rows, self.plan.batch_rows, self.plan.batch_bytes))

    async def _batch(
        self, client: Client, chunk: Chunk[P], start: int, rows: Rows, limiter: trio.Semaphore
    ) -> None:
        """The call of the rows from ``start`` of ``chunk`` (``rows``, packed), their
        results put in place."""
        end = start + rows.count
        if chunk.ids is not None:
            message_id = batch_id(self.plan.run_id, chunk.ids[start:end])
        else:
            self.sequence += 1
            message_id = f"{self.prefix}{self.sequence}"
        try:
            if rows is ALONE:
                try:
                    values: list[object] = [
                        await self._call(client, message_id, args=chunk.args[start])
                    ]
                except RemoteError as exc:
                    values = [exc]
            else:
                values = cast(list[object], await self._call(client, message_id, rows=rows))
        except Exception as exc:  # no answer at all: the task fails (and Spark retries it)
            self._fail(exc)
            return
        finally:
            limiter.release()
        for index, value in enumerate(values, start):
            if isinstance(value, RemoteError):
                if self.plan.on_error == "raise":
                    self._fail(value)
                    return
                chunk.errors[index] = str(value)
                self.counts.errors += 1
            else:
                chunk.values[index] = value
        self.counts.rows += rows.count
        chunk.left -= rows.count
        if chunk.left == 0:
            chunk.done.set()

    async def _call(
        self,
        client: Client,
        message_id: str,
        *,
        args: tuple[object, ...] = (),
        rows: Rows | None = None,
    ) -> object:
        """A row's call (``args``) or a batch's (``rows``: each row's value or error);
        after a lost connection, the same again (same message-id) on the client's next
        connection, until its ``timeout`` has passed."""
        plan = self.plan
        deadline = trio.current_time() + plan.timeout
        while True:
            left = deadline - trio.current_time()
            try:
                if rows is not None:
                    return await call_batch(
                        client,
                        plan.address,
                        plan.operation,
                        rows,
                        timeout=left,
                        message_id=message_id,
                    )
                return await client.call(
                    plan.address, plan.operation, *args, timeout=left, message_id=message_id
                )
            except ConnectionLostError as exc:
                if trio.current_time() >= deadline:
                    raise
                error = scrubbed(str(exc), plan.url)
                log.info("spark.resend", message_id=message_id, error=error)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.scope.cancel()


def run_task(plan: Plan, reader: Callable[[], Chunk[P] | None]) -> Generator[Chunk[P], None, None]:
    """Answer every chunk ``reader`` returns (until it returns None), yielding them in order.

    ``reader`` runs in a helper thread: it may block on Spark's input. A failure, local or
    remote (``on_error="raise"``), is raised here, in the Spark thread, as itself."""
    calls = _Calls(plan, reader)
    thread = start_trio_thread(calls.main, name="pairlink-spark-task")
    try:
        while True:
            try:
                chunk = thread.run(calls.out_recv.receive)
            except (trio.EndOfChannel, trio.RunFinishedError):
                break
            yield chunk
    except BaseException:  # the consumer stopped early (GeneratorExit): end the calls now
        thread.stop()
        raise
    # not stopped: a cancel landing while the calls clean up after a failure would lose it
    try:
        thread.join()  # raises the task's failure
    except PairlinkError as exc:  # Spark prints the traceback: ours is no news to its reader
        raise exc.with_traceback(None) from None


def batch_id(run_id: str, ids: Sequence[str]) -> str:
    """The message-id of a batch of rows of these ids: the row's own for one row, else the
    run's and a digest of them all (the same rows, the same id, however long their keys: a
    dedup store keeps ids up to 256 characters)."""
    if len(ids) == 1:
        return ids[0]
    digest = hashlib.blake2b("\0".join(ids).encode(), digest_size=16).hexdigest()
    return f"{run_id}:batch:{digest}"


def message_ids(run_id: str, keys: Sequence[object], column: str) -> list[str]:
    """The message-id of each row: ``<run_id>:<key>``, stable across task retries. Keys must
    be unique: a repeated key would get the first row's reply (checked within a chunk)."""
    if any(key is None for key in keys):
        raise ValueError(f"the key column {column!r} has a null: every row needs a key")
    ids = [f"{run_id}:{key}" for key in keys]
    if len(set(ids)) != len(ids):
        raise ValueError(f"the key column {column!r} repeats a key: every row needs its own")
    return ids
