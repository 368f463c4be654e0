"""register_function: a service operation as a Spark SQL function, on real PySpark
(local[2,4], Arrow batches of 500 rows) against real services over TCP."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pairlink import current_call, handler, service
from pairlink.spark import ERROR_COLUMN, register_function, serve_in_thread
from tests.spark.recorder import Served, expected

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


@service("texts", max_concurrency=64, mailbox=1024)
class Texts:
    """``length``: a one-argument operation that notes the connection each call came on."""

    def __init__(self) -> None:
        self.peers: Counter[str] = Counter()

    @handler
    def length(self, text: str) -> int:
        self.peers[current_call().peer] += 1
        return len(text)


@pytest.fixture
def texts() -> Iterator[tuple[Texts, str]]:
    service = Texts()
    with serve_in_thread(service) as server:
        yield service, server.url


@pytest.fixture
def reviews(spark: SparkSession) -> Iterator[str]:
    """A view of 4,000 rows in 2 partitions (each 4 Arrow batches), every 7th text 'boom'."""
    spark.range(4000, numPartitions=2).selectExpr(
        "id", "if(id % 7 = 3, 'boom', concat('row ', id)) as text"
    ).createOrReplaceTempView("reviews")
    yield "reviews"
    spark.catalog.dropTempView("reviews")


def register_score(spark: SparkSession, recorder: Served, **options: Any) -> Any:
    """``score(id, text)``: the recorder's ``score`` as a SQL function of its struct reply."""
    return register_function(
        spark,
        "score",
        url=recorder.url,
        address="recorder",
        operation="score",
        returns="score double, label string",
        **options,
    )


def test_a_one_argument_function_answers_every_row_on_one_connection_per_task(
    spark: SparkSession, texts: tuple[Texts, str], reviews: str
) -> None:
    service, url = texts
    register_function(
        spark, "text_length", url=url, address="texts", operation="length", returns="int"
    )
    got = spark.sql("SELECT id, text, text_length(text) AS n FROM reviews").collect()
    assert [(r.id, r.n) for r in got] == [(r.id, len(r.text)) for r in got]
    assert [r.id for r in got] == list(range(4000))
    # two tasks, four batches each: one connection per task, not per batch
    assert sorted(service.peers.values()) == [2000, 2000]


def test_a_struct_function_of_two_arguments_gives_each_row_its_reply(
    spark: SparkSession, recorder: Served
) -> None:
    spark.range(3000, numPartitions=3).selectExpr(
        "id", "concat('row ', id) as text"
    ).createOrReplaceTempView("plain")
    score = register_score(spark, recorder, in_flight=32)
    got = spark.sql("SELECT id, score(id, text) AS s FROM plain").collect()
    assert [(r.id, r.s.score, r.s.label) for r in got] == [(i, *expected(i)) for i in range(3000)]
    assert recorder.service.runs == dict.fromkeys(range(3000), 1)
    # the function returned is the DataFrame API's too
    picked = spark.table("plain").where("id < 5").select(score("id", "text").label.alias("label"))
    assert [r.label for r in picked.collect()] == [f"ROW {i}" for i in range(5)]
    spark.catalog.dropTempView("plain")


def test_a_failing_row_fails_the_query_with_the_remote_error(
    spark: SparkSession, recorder: Served, reviews: str
) -> None:
    register_score(spark, recorder)
    with pytest.raises(Exception, match=r"RemoteError: \[500\] ValueError: boom at \d+"):
        spark.sql("SELECT score(id, text) FROM reviews").collect()


def test_on_error_column_returns_the_result_and_the_error_of_each_row(
    spark: SparkSession, recorder: Served, reviews: str
) -> None:
    register_score(spark, recorder, on_error="column")
    got = spark.sql(
        f"SELECT id, s.* FROM (SELECT id, score(id, text) AS s FROM {reviews})"
    ).collect()
    assert len(got) == 4000
    for row in got:
        if row.id % 7 == 3:
            assert (row.result, row[ERROR_COLUMN]) == (None, f"[500] ValueError: boom at {row.id}")
        else:
            assert (tuple(row.result), row[ERROR_COLUMN]) == (expected(row.id), None)


def test_a_reply_that_does_not_fit_the_type_is_an_error_naming_the_row(
    spark: SparkSession, recorder: Served
) -> None:
    """``shaped`` answers SHAPES[id]: row 0 fits, row 1 is 0.8944 for an int field."""
    spark.range(2, numPartitions=1).createOrReplaceTempView("two")
    shaped = functools.partial(
        register_function,
        spark,
        "shaped",
        url=recorder.url,
        address="recorder",
        operation="shaped",
        returns="n int, x double, flag boolean, s string",
    )
    shaped(on_error="column")
    got = [
        tuple(r) for r in spark.sql("SELECT s.* FROM (SELECT shaped(id) AS s FROM two)").collect()
    ]
    why = "row #1 of partition 0: result column 'n' (int) cannot hold the float 0.8944: "
    assert got[0] == ((2, 3.0, True, "a"), None)
    assert got[1][0] is None and got[1][1].startswith(why)
    shaped()
    with pytest.raises(Exception, match=re.escape("ValueError: " + why)):
        spark.sql("SELECT shaped(id) FROM two").collect()
    spark.catalog.dropTempView("two")
