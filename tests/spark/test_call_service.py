"""call_service and call_partitions on real PySpark (local[2,4]) against a real service."""

from __future__ import annotations

import functools
import io
import re
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pairlink._rpc.batch import DEFAULT_BATCH_ROWS
from pairlink.spark import ERROR_COLUMN, Progress, call_partitions, call_service
from tests.spark.recorder import SHAPES, Served, die_once_at, expected

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def rows(spark: SparkSession, n: int, partitions: int = 4) -> DataFrame:
    return spark.range(n, numPartitions=partitions).selectExpr("id", "concat('row ', id) as text")


def score(df: DataFrame, url: str, address: str = "recorder", **options: object) -> DataFrame:
    return call_service(
        df,
        url=url,
        address=address,
        operation="score",
        args=["id", "text"],
        result_schema="score double, label string",
        **options,  # type: ignore[arg-type]
    )


def test_every_row_gets_its_own_reply_joined_in_input_order(spark, recorder: Served) -> None:
    service, url = recorder.service, recorder.url
    out = score(rows(spark, 10_000), url, key="id", in_flight=64)
    assert out.columns == ["id", "text", "score", "label"]
    got = [tuple(row) for row in out.collect()]
    assert got == [(i, f"row {i}", *expected(i)) for i in range(10_000)]
    assert service.runs == dict.fromkeys(range(10_000), 1)


def test_a_consumer_that_stops_early_ends_the_tasks(spark, recorder: Served) -> None:
    url = recorder.url
    got = score(rows(spark, 5000, partitions=2), url).limit(3).collect()
    assert [tuple(row) for row in got] == [(i, f"row {i}", *expected(i)) for i in range(3)]


def test_on_error_column_fills_error_and_leaves_the_results_null(spark, recorder: Served) -> None:
    url = recorder.url
    df = spark.range(1000, numPartitions=2).selectExpr(
        "id", "if(id % 7 = 0, 'boom', concat('row ', id)) as text"
    )
    out = score(df, url, on_error="column")
    assert out.columns == ["id", "text", "score", "label", ERROR_COLUMN]
    for row in out.collect():
        if row.id % 7 == 0:
            assert (row.score, row.label) == (None, None)
            assert row[ERROR_COLUMN] == f"[500] ValueError: boom at {row.id}"
        else:
            assert (row.score, row.label, row[ERROR_COLUMN]) == (*expected(row.id), None)


def test_on_error_raise_fails_the_job_with_the_remote_error(spark, recorder: Served) -> None:
    url = recorder.url
    df = spark.range(100, numPartitions=1).selectExpr(
        "id", "if(id = 42, 'boom', concat('row ', id)) as text"
    )
    with pytest.raises(Exception, match=r"RemoteError: \[500\] ValueError: boom at 42"):
        score(df, url, key="id").collect()


def test_a_task_never_has_more_than_in_flight_batches_outstanding(spark, recorder: Served) -> None:
    """Batches of 10 rows, whose rows run one after another: the handlers running at once for
    a partition are its batches outstanding."""
    service, url = recorder.service, recorder.url
    df = spark.range(0, 1200, numPartitions=2).selectExpr("spark_partition_id() as part", "id")
    out = call_service(
        df,
        url=url,
        address="recorder",
        operation="slow",
        args=["part", "id"],
        result_schema="doubled long",
        in_flight=7,
        batch_rows=10,
    )
    assert [row.doubled for row in out.collect()] == [2 * i for i in range(1200)]
    assert dict(service.peaks) == {0: 7, 1: 7}  # reached, never passed, by each task


def test_a_task_killed_mid_partition_is_retried_and_each_key_runs_once(
    spark, recorder: Served, tmp_path: Path
) -> None:
    service, url = recorder.service, recorder.url
    marker = tmp_path / "killed"
    rdd = spark.sparkContext.parallelize(range(3000), 1).map(
        functools.partial(die_once_at, marker, 2500)
    )
    out = call_partitions(
        rdd,
        url=url,
        address="recorder",
        operation="score",
        args=lambda i: (i, f"row {i}"),
        key=lambda i: i,
        in_flight=50,
    )
    got = out.collect()
    assert marker.exists()  # the first attempt died
    assert got == [(i, {"score": expected(i)[0], "label": expected(i)[1]}) for i in range(3000)]
    assert service.runs == dict.fromkeys(range(3000), 1)
    # the retry sent again what the dead attempt had sent: 2 chunks of 1,000 rows at least,
    # in batches of 256 rows or fewer
    assert recorder.dedup_hits >= 2 * (1000 // DEFAULT_BATCH_ROWS)


def test_a_dataframe_task_killed_mid_partition_is_retried_and_each_key_runs_once(
    spark: SparkSession, recorder: Served, tmp_path: Path
) -> None:
    """The same through ``call_service``: a Python UDF ahead of the calls kills the worker
    once at row 2500; Spark retries the task, which sends the same ids (``key``)."""
    from pyspark.sql.functions import udf

    service = recorder.service
    marker = tmp_path / "killed"
    die_udf = udf(lambda row: die_once_at(marker, 2500, row), "long")
    df = rows(spark, 3000, partitions=1).select(die_udf("id").alias("id"), "text")
    got = score(df, recorder.url, key="id", in_flight=50).orderBy("id").collect()
    assert marker.exists()  # the first attempt died
    assert [(r.id, r.score, r.label) for r in got] == [(i, *expected(i)) for i in range(3000)]
    assert service.runs == dict.fromkeys(range(3000), 1)
    assert recorder.dedup_hits >= 1  # the retry sent again what the dead attempt had sent


def test_a_service_that_is_down_fails_the_job_with_a_clear_error(spark) -> None:
    df = rows(spark, 100, partitions=1)
    why = re.escape("cannot reach the service 'recorder' at amqp://127.0.0.1:1")
    with pytest.raises(Exception, match=why):
        score(df, "amqp://127.0.0.1:1", connect_timeout=2.0).collect()


def test_a_wrong_address_fails_the_job_with_one_short_line_naming_it(
    spark, recorder: Served
) -> None:
    df = rows(spark, 200, partitions=1)
    with pytest.raises(Exception) as failed:
        score(df, recorder.url, address="scorre").collect()
    why = "pairlink.errors.LinkDetachedError: amqp:not-found: no service at the address "
    why += f"'scorre' on {recorder.url}"
    assert why in str(failed.value).splitlines()
    assert len(str(failed.value)) < 1000  # no traceback per pipelined call stacked on it


def test_progress_counts_every_row_over_the_side_channel(spark, recorder: Served) -> None:
    url = recorder.url
    stream = io.StringIO()
    with Progress(spark, total=10_000, stream=stream) as progress:
        df = rows(spark, 10_000).selectExpr("id", "if(id % 100 = 0, 'boom', text) as text")
        score(df, url, on_error="column", progress=progress).write.format("noop").mode(
            "overwrite"
        ).save()
    assert (progress.mode, progress.rows, progress.errors) == ("rows", 10_000, 100)
    assert "100.0%  10,000/10,000 rows" in stream.getvalue()


def test_progress_falls_back_to_tasks_when_the_side_channel_is_unreachable(
    spark, recorder: Served
) -> None:
    url = recorder.url
    stream = io.StringIO()
    with Progress(spark, stream=stream, advertise="amqp://127.0.0.1:1") as progress:
        got = score(rows(spark, 2000), url, progress=progress).collect()
    assert len(got) == 2000
    assert (progress.mode, progress.rows) == ("tasks", 0)
    assert progress.tasks() == (4, 4)
    assert "tasks 4/4 done" in stream.getvalue()


def shaped(df: DataFrame, url: str, **options: object) -> DataFrame:
    return call_service(
        df,
        url=url,
        address="recorder",
        operation="shaped",
        args=["id"],
        result_schema="n int, x double, flag boolean, s string",
        **options,  # type: ignore[arg-type]
    )


def test_replies_that_do_not_fit_their_columns_are_row_errors(spark, recorder: Served) -> None:
    df = spark.range(len(SHAPES), numPartitions=1)
    out = shaped(df, recorder.url, key="id", on_error="column").collect()
    got = {row.id: tuple(row)[1:] for row in out}
    errors = {
        1: "result column 'n' (int) cannot hold the float 0.8944: "
        "Float value 0.894400 was truncated converting to int32",
        2: "result column 'n': the reply {'flag': False, 's': 'c', 'x': 1.5} has no such field",
        3: "result column 'n' (int) cannot hold the str '12': "
        "Could not convert '12' with type str: tried to convert to int32",
        4: "result column 'n' (int) cannot hold the bool True: Expected integer, got bool",
        5: "result column 'flag' (boolean) cannot hold the int 1: "
        "Could not convert 1 with type int: tried to convert to boolean",
    }
    assert got == {
        0: (2, 3.0, True, "a", None),
        **{i: (None, None, None, None, f"row id={i}: {why}") for i, why in errors.items()},
        6: (7, None, None, "g", None),
    }


def test_on_error_raise_fails_the_job_naming_the_row_column_and_value(
    spark, recorder: Served
) -> None:
    """By its key when there is one, else by its position in its partition."""
    df = spark.range(len(SHAPES), numPartitions=1)
    why = re.escape("ValueError: row id=1: result column 'n' (int) cannot hold the float 0.8944")
    with pytest.raises(Exception, match=why):
        shaped(df, recorder.url, key="id").collect()
    missing = df.where("id in (0, 2)")
    why = re.escape("ValueError: row #1 of partition 0: result column 'n': the reply {")
    with pytest.raises(Exception, match=why):
        shaped(missing, recorder.url).collect()
