"""Running a batch (:mod:`pairlink._rpc.batch`): its rows through a per-row handler one after
another, or all at once through a vectorised one (``@handler(batch=True)`` or ``"arrow"``).

Whatever happens to one row is that row's result: arguments that do not fit the handler (400),
its exception (answered by the service's disclosure rules: ``RowFailed``), the deadline
passing before it ran or while it ran (408). The batch itself is answered 200 with every
row's result, so one bad row never costs the others theirs. A vectorised handler that raises
fails each of its rows with that one error (logged once).

The batch holds one mailbox slot and one running slot, like a call: its rows run one after
another (an ``async def`` awaited row by row in one worker, a plain ``def`` looping in one
thread), so a batch of slow I/O-bound rows takes their sum; a caller wanting them concurrent
sends several batches (``proxy.map``'s ``in_flight``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import trio

from pairlink._rpc import batch, deadline
from pairlink._rpc.payload import Encoding, split_arguments
from pairlink._rpc.wire import BAD_REQUEST, TIMEOUT
from pairlink._server.calls import Call
from pairlink._server.disclosure import RowFailed
from pairlink._server.service import Operation
from pairlink.errors import PayloadError

TIMED_OUT = batch.failed(TIMEOUT, "the deadline passed before the row ran")
CUT_SHORT = batch.failed(TIMEOUT, "the deadline passed while the row ran")

REPLY_MARGIN = 0.05
"""Seconds before a batch's deadline at which its rows not yet answered get 408: the reply
leaves in time to reach a caller that waits until the deadline, with the results of the rows
that did run (a reply sent at the deadline itself would lose them all to the caller's own
timeout). A batch given less than ten times this keeps a tenth of its time instead."""

Checked = list[tuple[int, list[Any], dict[str, Any]]]
"""The rows whose arguments fit the handler: their index in the batch, and the arguments."""


def run(call: Call, instance: object, failed: RowFailed) -> object:
    """A batch's rows' results, or a single call's result through a vectorised handler,
    for a plain ``def`` (in a thread, or inline)."""
    operation = call.operation
    if not call.batched:
        return only(operation, one(operation, instance, call.args, call.kwargs))
    if operation.batch == "rows":
        return run_rows(operation, instance, call.args, call.request.deadline, failed)
    return run_vectorised(operation, instance, call.args, failed)


async def run_async(call: Call, instance: object, failed: RowFailed) -> object:
    """:func:`run` for an ``async def``."""
    operation = call.operation
    if not call.batched:
        return only(operation, await one(operation, instance, call.args, call.kwargs))
    if operation.batch == "rows":
        return await run_rows_async(operation, instance, call.args, call.request.deadline, failed)
    return await run_vectorised_async(operation, instance, call.args, failed)


def checked_rows(operation: Operation, rows: Sequence[object]) -> tuple[list[object], Checked]:
    """Each row's result slot (a 400 already for a row whose arguments do not fit), and the
    rows to run."""
    out: list[object] = [None] * len(rows)
    runnable: Checked = []
    for index, row in enumerate(rows):
        try:
            # the usual row, [args, {}], taken as it is: split_arguments would find it so
            if type(row) is list and len(row) == 2 and type(row[0]) is list and row[1] == {}:
                args, kwargs = row
            else:
                args, kwargs = split_arguments(row, Encoding.ENVELOPE)
            operation.check_arguments(args, kwargs)
        except (PayloadError, TypeError) as exc:
            out[index] = batch.failed(BAD_REQUEST, f"{operation.name}: {exc}")
            continue
        runnable.append((index, args, kwargs))
    return out, runnable


def run_rows(
    operation: Operation,
    instance: object,
    rows: Sequence[object],
    ends: float | None,
    failed: RowFailed,
) -> list[object]:
    """A plain ``def`` handler (in a thread, or inline) over each row; ``ends``: the
    batch's deadline (wall clock), from which (less :data:`REPLY_MARGIN`) the rows not
    started get 408."""
    out, runnable = checked_rows(operation, rows)
    function = operation.function
    cut = math.inf if ends is None else row_cutoff(ends)
    for index, args, kwargs in runnable:
        if deadline.wall_time() >= cut:
            out[index] = TIMED_OUT
            continue
        try:
            out[index] = batch.ok(function(instance, *args, **kwargs))
        except Exception as exc:
            out[index] = failed(exc)
    return out


def row_cutoff(ends: float) -> float:
    """When a batch due at ``ends`` (wall clock) stops starting rows: :data:`REPLY_MARGIN`
    before, or a tenth of the time it has left when that is less."""
    return ends - min(REPLY_MARGIN, max(0.0, ends - deadline.wall_time()) / 10)


async def run_rows_async(
    operation: Operation,
    instance: object,
    rows: Sequence[object],
    ends: float | None,
    failed: RowFailed,
) -> list[object]:
    """An ``async def`` handler over each row, each under the batch's deadline (less
    :data:`REPLY_MARGIN`): a row it cuts short, and those after it, get 408."""
    out, runnable = checked_rows(operation, rows)
    function = operation.function
    limit = None
    if ends is not None:
        limit = trio.current_time() + (row_cutoff(ends) - deadline.wall_time())
    for index, args, kwargs in runnable:
        if limit is not None and trio.current_time() >= limit:
            out[index] = TIMED_OUT
            continue
        try:
            if limit is None:
                out[index] = batch.ok(await function(instance, *args, **kwargs))
                continue
            with trio.move_on_at(limit):
                out[index] = batch.ok(await function(instance, *args, **kwargs))
                continue
            out[index] = CUT_SHORT
        except Exception as exc:
            out[index] = failed(exc)
    return out


def columns(operation: Operation, runnable: Checked) -> list[object]:
    """The arguments of a vectorised handler for these rows: a list per parameter (its
    values, row by row, a default where a row left it out), or an Arrow array."""
    names = operation.parameters
    if all(not kwargs and len(args) == len(names) for _, args, kwargs in runnable):
        lists = [list(column) for column in zip(*(args for _, args, _ in runnable), strict=True)]
        if not lists:
            lists = [[] for _ in names]
    else:
        signature = operation.signature
        lists = [[] for _ in names]
        for _, args, kwargs in runnable:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for column, name in zip(lists, names, strict=True):
                column.append(bound.arguments[name])
    if operation.batch != "arrow":
        return list(lists)
    import pyarrow as pa  # only a service that asks for Arrow needs it

    return [pa.array(column) for column in lists]


def fill(
    operation: Operation,
    out: list[object],
    runnable: Checked,
    result: object,
    failed: RowFailed,
) -> list[object]:
    """``out`` with the rows' results from what a vectorised handler returned: a sequence of
    one result per row (a list, a tuple, an Arrow or NumPy array), where an exception fails
    its row alone. Anything else is the handler's error, and fails every row."""
    try:
        values = _results(operation, result, len(runnable))
    except TypeError as exc:
        return fail_all(out, runnable, failed(exc))
    for (index, _, _), value in zip(runnable, values, strict=True):
        out[index] = failed(value) if isinstance(value, Exception) else batch.ok(value)
    return out


def _results(operation: Operation, result: object, rows: int) -> Sequence[object]:
    """A vectorised handler's results as a sequence of ``rows``; ``TypeError`` if they are
    not that."""
    if hasattr(result, "to_pylist"):
        result = result.to_pylist()
    elif hasattr(result, "tolist"):
        result = result.tolist()
    if not isinstance(result, list | tuple) or len(result) != rows:
        size = f"{len(result)} results" if isinstance(result, list | tuple) else repr(result)
        raise TypeError(f"the batch handler {operation.name!r} returned {size:.80} for {rows} rows")
    return result


def one(operation: Operation, instance: object, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A single call to a vectorised handler, as a batch of one: its call, whose result
    :func:`only` reads (awaited first if the handler is async)."""
    return operation.function(instance, *columns(operation, [(0, args, kwargs)]))


def only(operation: Operation, result: object) -> object:
    """The one row's result of :func:`one`; its exception raised, as a call's would be."""
    (value,) = _results(operation, result, 1)
    if isinstance(value, Exception):
        raise value
    return value


def fail_all(out: list[object], runnable: Checked, error: list[object]) -> list[object]:
    """``out`` with every runnable row failed with ``error``."""
    for index, _, _ in runnable:
        out[index] = error
    return out


def run_vectorised(
    operation: Operation, instance: object, rows: Sequence[object], failed: RowFailed
) -> list[object]:
    """A plain ``def`` vectorised handler (in a thread, or inline) over the whole batch."""
    out, runnable = checked_rows(operation, rows)
    if not runnable:
        return out
    try:
        result = operation.function(instance, *columns(operation, runnable))
    except Exception as exc:
        return fail_all(out, runnable, failed(exc))
    return fill(operation, out, runnable, result, failed)


async def run_vectorised_async(
    operation: Operation, instance: object, rows: Sequence[object], failed: RowFailed
) -> list[object]:
    """An ``async def`` vectorised handler over the whole batch (the call's deadline applies
    to it whole, as to a call's)."""
    out, runnable = checked_rows(operation, rows)
    if not runnable:
        return out
    try:
        result = await operation.function(instance, *columns(operation, runnable))
    except Exception as exc:
        return fail_all(out, runnable, failed(exc))
    return fill(operation, out, runnable, result, failed)
