"""A service operation as a Spark SQL function: ``SELECT score(id, text) FROM reviews``.

:func:`register_function` registers a vectorised UDF, Spark's Arrow iterator form
(``SQL_SCALAR_ARROW_ITER_UDF``): a task hands the function an iterator over all its Arrow
batches, so the task keeps one connection for every batch, and its calls go through
:func:`~pairlink._spark._task.run_task` exactly as ``call_service``'s do (pipelined, batched the
same way, resent with their ids after a lost connection). Replies become Arrow arrays through the
same checks as ``call_service``'s result columns (:mod:`pairlink._spark._results`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pairlink._rpc.batch import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS
from pairlink._spark._results import ArrowArray, Column, result_arrays
from pairlink._spark._task import Chunk, OnError, Plan, run_task
from pairlink._spark.api import ERROR_COLUMN, _columns, _plan, row_position

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql._typing import UserDefinedFunctionLike
    from pyspark.sql.types import DataType

RESULT_FIELD = "result"
"""With ``on_error="column"`` the function returns ``struct<result: <returns>, _error: string>``
(as Databricks' ``ai_query`` with ``failOnError => false`` returns its result and its error)."""


def register_function(
    spark: SparkSession,
    name: str,
    *,
    url: str | Sequence[str],
    address: str,
    operation: str,
    returns: str | DataType,
    in_flight: int = 200,
    timeout: float = 30.0,
    on_error: OnError = "raise",
    connect_timeout: float = 10.0,
    ca: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    sasl: bool | str = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> UserDefinedFunctionLike:
    """Register ``name`` as a Spark SQL function that calls ``operation`` of the service at
    ``address`` once per row, with the function's arguments as the call's positional
    arguments: ``SELECT name(text) FROM t``, ``SELECT name(a, b) FROM t``. Returns the function,
    for the DataFrame API too (``df.select(fn("text"))``).

    ``returns``: the function's type, a DDL string (``"double"``, ``"array<string>"``; several
    fields, ``"score double, label string"``, make a struct: ``name(text).label``) or a
    ``DataType``. The reply fills it as in ``call_service``: a struct by name (dict) or
    position (list, tuple), any other type from the reply itself; a None reply is a null; a
    value that does not fit is an error naming the row (its position in its partition).
    ``on_error="raise"`` fails the task with the first failing row's error (the service's
    ``RemoteError``, or the ``ValueError`` of a reply that does not fit); ``"column"`` returns
    ``struct<result: <returns>, _error: string>`` instead, ``result`` null and ``_error`` the
    reason where a row failed. A call that gets no answer at all fails the task either way.

    Each Spark task opens one connection for all its rows, as ``call_service``'s tasks do;
    ``url``, ``in_flight``, ``timeout``, ``connect_timeout``, ``ca``, ``client_cert``,
    ``client_key``, ``sasl``, ``batch_rows`` and ``batch_bytes`` mean what they mean there (the
    rows go in batches, many to a message). A function has no row key: its
    calls are numbered per task attempt, so a retried task runs its rows' handlers again
    (``call_service`` with ``key=`` is the exactly-once form). The function is registered as
    nondeterministic: a call may have effects, so Spark must neither repeat nor drop it.
    """
    from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.types import StringType, StructField, StructType

    plan = _plan(
        url,
        address,
        operation,
        in_flight=in_flight,
        timeout=timeout,
        on_error=on_error,
        run_id=None,
        progress=None,
        connect_timeout=connect_timeout,
        ca=ca,
        client_cert=client_cert,
        client_key=client_key,
        sasl=sasl,
        batch_rows=batch_rows,
        batch_bytes=batch_bytes,
    )
    declared = _parsed(returns)
    result_type: DataType = declared
    if on_error == "column":
        result_type = StructType(
            [StructField(RESULT_FIELD, declared), StructField(ERROR_COLUMN, StringType())]
        )
    spec = _FunctionPlan(plan, _shape(declared))
    with warnings.catch_warnings():  # the arity is the caller's: no type hints can say it
        warnings.filterwarnings("ignore", "It is preferred to specify type hints", UserWarning)
        # the stubs allow neither a struct type nor both argument forms; Spark takes both
        function = arrow_udf(  # type: ignore[call-overload]
            functools.partial(_answer_batches, spec), result_type, ArrowUDFType.SCALAR_ITER
        )
    return spark.udf.register(name, function.asNondeterministic())


def _parsed(returns: str | DataType) -> DataType:
    """``returns`` as a DataType (a DDL string parsed by Spark, as ``arrow_udf`` would)."""
    from pyspark.sql.types import DataType, _parse_datatype_string

    if isinstance(returns, DataType):
        return returns
    return _parse_datatype_string(returns)


@attrs.frozen
class _Shape:
    """How replies become the function's values: a struct's fields as ``call_service``'s
    result columns, any other type as one column holding the whole reply."""

    columns: tuple[Column, ...]
    struct: pa.DataType | None  # the struct's Arrow type; None: not a struct


def _shape(declared: DataType) -> _Shape:
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    if isinstance(declared, StructType):
        return _Shape(_columns(declared), to_arrow_type(declared))
    return _Shape((Column(RESULT_FIELD, declared.simpleString(), to_arrow_type(declared)),), None)


@attrs.frozen
class _FunctionPlan:
    """What a task of the function needs: the :class:`Plan` and the shape of its values."""

    plan: Plan
    shape: _Shape


def _answer_batches(
    spec: _FunctionPlan, batches: Iterator[ArrowArray | tuple[ArrowArray, ...]]
) -> Iterator[ArrowArray]:
    """A task's values: every batch of argument arrays (one array, or a tuple of them for
    several arguments) answered in order, through one ``run_task``."""
    plan = spec.plan

    def read() -> Chunk[int] | None:
        batch = next(batches, None)
        if batch is None:
            return None
        arrays = batch if isinstance(batch, tuple) else (batch,)
        if not arrays:
            raise ValueError("a service function takes at least one argument")
        rows = list(zip(*(array.to_pylist() for array in arrays), strict=True))
        return Chunk(len(rows), rows, None)

    rows_before = 0  # in this partition, before the chunk
    with contextlib.closing(run_task(plan, read)) as chunks:  # a bad reply ends the calls
        for chunk in chunks:
            yield _values(spec.shape, chunk, rows_before, plan.on_error)
            rows_before += chunk.payload


def _values(shape: _Shape, chunk: Chunk[int], rows_before: int, on_error: OnError) -> ArrowArray:
    """A chunk's replies as the function's Arrow array (``on_error`` as
    :func:`register_function` says); ``chunk.errors`` gains the replies that do not fit."""
    import pyarrow as pa

    def row_name(index: int) -> str:
        return row_position(rows_before + index)

    replies: list[Any] = chunk.values
    if shape.struct is None:  # the whole reply is the one value: never split by position
        replies = [(reply,) for reply in chunk.values]
    arrays = result_arrays(shape.columns, replies, chunk.errors, row_name, on_error)
    values = arrays[0]
    if shape.struct is not None:
        fields = [shape.struct.field(i) for i in range(shape.struct.num_fields)]
        nulls = [
            e is not None or v is None for v, e in zip(chunk.values, chunk.errors, strict=True)
        ]
        values = pa.StructArray.from_arrays(arrays, fields=fields, mask=pa.array(nulls))
    if on_error == "raise":
        return values
    errors = pa.array(chunk.errors, type=pa.string())
    return pa.StructArray.from_arrays([values, errors], names=[RESULT_FIELD, ERROR_COLUMN])
