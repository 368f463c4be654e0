"""The driver side: ``call_service`` for DataFrames, ``call_partitions`` for RDDs.

Both only check their arguments and build a picklable :class:`~pairlink._spark._task.Plan`;
the calls happen when Spark runs the tasks (:mod:`pairlink._spark._task`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import attrs

from pairlink._client.batches import check_batching
from pairlink._rpc.batch import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS
from pairlink._spark._results import Column, result_arrays
from pairlink._spark._task import Chunk, OnError, Plan, message_ids, run_task
from pairlink._spark._tls import security
from pairlink._spark._urls import endpoints

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from pairlink._spark.progress import Progress

_Row = TypeVar("_Row")  # an element of the caller's RDD

ERROR_COLUMN = "_error"
RDD_CHUNK = 1000
"""Rows of an RDD partition read at a time (an Arrow batch is a chunk of its own)."""


DEFAULT_MASTER = "local[2]"
"""The master when nothing names one: two local cores, what the examples and tests assume."""
SPARK_FALLBACK_MASTER = "local[*]"
"""What Spark's launcher sets when told no master: it means "none given", not a choice."""


def local_session(
    master: str | None = None, app_name: str = "pairlink", **conf: str
) -> SparkSession:
    """A SparkSession set up for pairlink: the workers run this interpreter
    (``PYSPARK_PYTHON``: another one would import another trio, or none), Spark binds
    127.0.0.1 (``SPARK_LOCAL_IP``, ``spark.driver.host``; local masters only), and Spark's
    own console progress bar is off so that :class:`~pairlink.spark.Progress` can draw.
    ``conf``: more Spark settings.

    The master, first found of: an active session (returned as it is, ``conf`` unapplied:
    Spark cannot change a running session's static settings); ``master``; the one Spark was
    launched with (``spark-submit --master``, ``--master`` in ``PYSPARK_SUBMIT_ARGS``,
    ``MASTER``, ``spark.master`` in ``spark-defaults.conf``); else ``local[2]``. Spark's own
    fallback ``local[*]`` counts as none given, except under ``spark-submit``."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master is None or master.startswith("local"):  # read when the JVM starts, next
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    chosen = _master(master)
    local = chosen.startswith("local")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        **({"spark.driver.host": "127.0.0.1"} if local else {}),
        **conf,
    }
    builder = SparkSession.builder.master(chosen).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _master(requested: str | None) -> str:
    """The master to use when no session is active (rule in :func:`local_session`)."""
    if requested is not None:
        return requested
    from pyspark import SparkConf, SparkContext

    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    SparkContext._ensure_initialized()  # the JVM: its conf holds what the launcher was told
    configured = SparkConf().get("spark.master")
    if configured is None or (configured == SPARK_FALLBACK_MASTER and not under_submit):
        return DEFAULT_MASTER
    return configured


def _checked(
    url: str | Sequence[str], timeout: float, on_error: str, connect_timeout: float
) -> str | tuple[str, ...]:
    """The endpoints, once the times and ``on_error`` are checked too."""
    urls = endpoints(url)
    for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a finite number of seconds > 0")
    if on_error not in ("raise", "column"):
        raise ValueError(f'on_error must be "raise" or "column", not {on_error!r}')
    return urls


def call_service(
    df: DataFrame,
    *,
    url: str | Sequence[str],
    address: str,
    operation: str,
    args: Sequence[str],
    result_schema: str | StructType,
    key: str | None = None,
    in_flight: int = 200,
    timeout: float = 30.0,
    on_error: OnError = "raise",
    run_id: str | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
    ca: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    sasl: bool | str = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> DataFrame:
    """``df`` with the reply to one call per row as new columns (lazy, like any transformation).

    Each row calls ``operation`` of the service at ``address`` with the values of the ``args``
    columns as positional arguments. ``url``: ``amqp[s]://[user:password@]host[:port]``, or
    the service's replicas: a list of such URLs, or one whose host name resolves to several
    addresses; each task then keeps a connection to every replica and sends each call to the
    ready one with the most free credit (as ``pairlink.connect`` does). Errors and logs show
    URLs without their password. The reply fills the ``result_schema`` columns (a DDL
    string such as ``"score double, label string"`` or a ``StructType``): a dict gives them by
    name, a list or tuple by position, and a plain value the single column of a one-column
    schema (a None reply: nulls). Values convert only when nothing is lost: 2.0 fills an int
    column, 0.89 does not; an int fills a double column if the double holds it exactly; a bool
    is not an int, nor a string a number. A reply that does not fit (a field missing, a value
    of another kind) is an error naming the row (``key=value``, else its position in its
    partition), the column and the value, handled as ``on_error`` says. Rows keep their
    order; the input columns come through unchanged.

    ``key``: a column whose value identifies the row; a batch's message-id is then
    ``<run_id>:batch:<digest of its rows' keys>`` (a single row's: ``<run_id>:<key>``), the
    same when Spark retries the task (the same rows make the same batches), so a service
    with ``dedup_window`` runs each key's handler once (in each replica's process: README, "Exactly
    once across replicas"). ``run_id`` (default: a new id per
    ``call_service`` call) scopes the keys: retries and recomputations of this DataFrame share
    it, another ``call_service`` does not. Without ``key`` every task attempt numbers its
    calls afresh (resends after a lost connection still reuse their ids).

    Rows go in batches, many to a message: up to ``batch_rows`` rows (default 256) or
    ``batch_bytes`` bytes of arguments (256 KiB), whichever fills first, cut within each Arrow
    batch; the service runs its handler for each row (or a ``@handler(batch=True)`` once per
    batch) and answers each row on its own. ``batch_rows=1``: each row a call of its own.
    ``in_flight``: messages (batches) a task has outstanding at most. ``timeout``: seconds a
    batch may take, resends after a lost connection included. ``on_error="raise"`` fails the
    task with the failed row's error (a ``RemoteError`` naming its status, type and message)
    or a reply's (a ``ValueError``); ``"column"`` puts it in a string column ``_error`` (null
    when the row succeeded) with null results: a failing row fails alone, its batch's other
    rows keep their results. Either way a batch that gets no answer at all (the service
    unreachable, its timeout passed) fails the task, which Spark may retry. ``progress``:
    report rows to that :class:`~pairlink.spark.Progress`.

    ``amqps://`` URLs: ``ca`` is a PEM file of the CAs to trust (default: the system's);
    ``client_cert`` and ``client_key`` PEM files of a client certificate (mutual TLS, and
    ``sasl="EXTERNAL"`` to log in as its subject); ``sasl=True`` logs in with the URL's
    user and password (PLAIN) if it has them, else ANONYMOUS. Paths, read on each executor:
    every worker needs the files at that path.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    plan = _plan(
        url,
        address,
        operation,
        in_flight=in_flight,
        timeout=timeout,
        on_error=on_error,
        run_id=run_id,
        progress=progress,
        connect_timeout=connect_timeout,
        ca=ca,
        client_cert=client_cert,
        client_key=client_key,
        sasl=sasl,
        batch_rows=batch_rows,
        batch_bytes=batch_bytes,
    )
    result = _result_struct(df, result_schema)
    columns = set(df.columns)
    missing = [c for c in [*args, *([key] if key else [])] if c not in columns]
    if missing:
        raise ValueError(f"no such column(s) in the DataFrame: {', '.join(missing)}")
    added = [f.name for f in result.fields] + ([ERROR_COLUMN] if on_error == "column" else [])
    clash = [name for name in added if name in columns]
    if clash:
        raise ValueError(f"the DataFrame already has column(s) {', '.join(clash)}")
    fields = list(df.schema.fields)
    fields += [StructField(f.name, f.dataType, nullable=True) for f in result.fields]
    if on_error == "column":
        fields.append(StructField(ERROR_COLUMN, StringType(), nullable=True))
    spec = _ArrowPlan(plan, tuple(args), key, _columns(result))
    return df.mapInArrow(functools.partial(_map_batches, spec), StructType(fields))


def call_partitions(
    rdd: RDD[_Row],
    *,
    url: str | Sequence[str],
    address: str,
    operation: str,
    args: Callable[[_Row], Sequence[object]] | None = None,
    key: Callable[[_Row], object] | None = None,
    in_flight: int = 200,
    timeout: float = 30.0,
    on_error: OnError = "raise",
    run_id: str | None = None,
    progress: Progress | None = None,
    connect_timeout: float = 10.0,
    ca: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    sasl: bool | str = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> RDD[tuple[object, ...]]:
    """The RDD form of :func:`call_service`: ``(row, reply)`` for every row, in order
    (``(row, reply, error)`` with ``on_error="column"``). ``args(row)`` gives the call's
    positional arguments (default: the row itself if it is a tuple or list, else the row as
    the one argument); ``key(row)`` the row's stable key. Other parameters as for
    ``call_service``."""
    plan = _plan(
        url,
        address,
        operation,
        in_flight=in_flight,
        timeout=timeout,
        on_error=on_error,
        run_id=run_id,
        progress=progress,
        connect_timeout=connect_timeout,
        ca=ca,
        client_cert=client_cert,
        client_key=client_key,
        sasl=sasl,
        batch_rows=batch_rows,
        batch_bytes=batch_bytes,
    )
    task = functools.partial(_map_rows, plan, args, key)
    return rdd.mapPartitions(task, preservesPartitioning=True)


# -- the plan ----------------------------------------------------------------------------------


def _plan(
    url: str | Sequence[str],
    address: str,
    operation: str,
    *,
    in_flight: int,
    timeout: float,
    on_error: OnError,
    run_id: str | None,
    progress: Progress | None,
    connect_timeout: float,
    ca: str | os.PathLike[str] | None,
    client_cert: str | os.PathLike[str] | None,
    client_key: str | os.PathLike[str] | None,
    sasl: bool | str,
    batch_rows: int,
    batch_bytes: int,
) -> Plan:
    """The plan of a fan-out's tasks, once every option is checked (the driver's side of
    ``call_service``, ``call_partitions`` and ``register_function``)."""
    check_batching(in_flight, batch_rows, batch_bytes)
    urls = _checked(url, timeout, on_error, connect_timeout)
    if progress is not None and progress.url is None and progress.side_channel:
        raise ValueError("pass the Progress inside its `with` block (it listens from there)")
    return Plan(
        url=urls,
        address=address,
        operation=operation,
        in_flight=in_flight,
        timeout=timeout,
        on_error=on_error,
        run_id=run_id or uuid.uuid4().hex,
        connect_timeout=connect_timeout,
        progress_url=progress.url if progress is not None else None,
        security=security(ca, client_cert, client_key, sasl),
        batch_rows=batch_rows,
        batch_bytes=batch_bytes,
    )


def _result_struct(df: DataFrame, schema: str | StructType) -> StructType:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    parsed = df.sparkSession.createDataFrame([], schema).schema
    if not parsed.fields:
        raise ValueError(f"result_schema {schema!r} names no columns")
    return parsed


def _columns(result: StructType) -> tuple[Column, ...]:
    from pyspark.sql.pandas.types import to_arrow_type

    return tuple(
        Column(f.name, f.dataType.simpleString(), to_arrow_type(f.dataType)) for f in result.fields
    )


# -- in the tasks ------------------------------------------------------------------------------


@attrs.frozen
class _ArrowPlan:
    """What a ``mapInArrow`` task needs beyond the :class:`Plan`: which columns are the
    arguments and the key, and the result columns."""

    plan: Plan
    args: tuple[str, ...]
    key: str | None
    result: tuple[Column, ...]


def _map_batches(spec: _ArrowPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    plan = spec.plan

    def read() -> Chunk[pa.RecordBatch] | None:
        batch = next(batches, None)
        if batch is None:
            return None
        columns = [batch.column(name).to_pylist() for name in spec.args]
        rows = list(zip(*columns, strict=True)) if columns else [()] * batch.num_rows
        ids = None
        if spec.key is not None:
            ids = message_ids(plan.run_id, batch.column(spec.key).to_pylist(), spec.key)
        return Chunk(batch, rows, ids)

    out_names = [column.name for column in spec.result]
    if plan.on_error == "column":
        out_names.append(ERROR_COLUMN)
    rows_before = 0  # in this partition, before the chunk
    with contextlib.closing(run_task(plan, read)) as chunks:  # a bad reply ends the calls
        for chunk in chunks:
            batch = chunk.payload
            row_name = functools.partial(_row_name, spec.key, batch, rows_before)
            arrays = result_arrays(spec.result, chunk.values, chunk.errors, row_name, plan.on_error)
            if plan.on_error == "column":
                arrays.append(pa.array(chunk.errors, type=pa.string()))
            rows_before += batch.num_rows
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, *arrays], names=[*batch.schema.names, *out_names]
            )


def _row_name(key: str | None, batch: pa.RecordBatch, rows_before: int, index: int) -> str:
    """A row for an error message: its key, else its position in its partition."""
    if key is not None:
        return f"row {key}={batch.column(key)[index].as_py()!r}"
    return row_position(rows_before + index)


def row_position(index: int) -> str:
    """A row without a key, for an error message: its position in its task's partition."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = f" of partition {context.partitionId()}" if context is not None else ""
    return f"row #{index}{partition}"


def _map_rows(
    plan: Plan,
    args: Callable[[_Row], Sequence[object]] | None,
    key: Callable[[_Row], object] | None,
    rows: Iterable[_Row],
) -> Iterator[tuple[object, ...]]:
    source = iter(rows)

    def read() -> Chunk[list[_Row]] | None:
        chunk = list(itertools.islice(source, RDD_CHUNK))
        if not chunk:
            return None
        if args is not None:
            arguments = [tuple(args(row)) for row in chunk]
        else:
            arguments = [tuple(row) if isinstance(row, tuple | list) else (row,) for row in chunk]
        ids = None if key is None else message_ids(plan.run_id, [key(r) for r in chunk], "key")
        return Chunk(chunk, arguments, ids)

    for chunk in run_task(plan, read):
        if plan.on_error == "column":
            yield from zip(chunk.payload, chunk.values, chunk.errors, strict=True)
        else:
            yield from zip(chunk.payload, chunk.values, strict=True)
