"""``benchmarks/spark.py`` compares like with like: its blocking baseline (one client per
partition) answers the same rows as ``call_service``, in order, with the same service work."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from benchmarks.spark import answer, child, enriched, text
from pairlink.spark import serve_in_thread
from services.enrich import Enrich, score_text

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


@pytest.mark.parametrize("kind", ["spark", "spark-rows", "blocking"])
def test_every_row_is_scored_once_in_input_order(spark: SparkSession, kind: str) -> None:
    with serve_in_thread(Enrich()) as server:
        got = [tuple(row) for row in enriched(spark, server.url, kind, 1500, 4).collect()]
        instance = server.hosted[0].instance
    assert got == [(i, text(i), *score_text(text(i))) for i in range(1500)]
    assert isinstance(instance, Enrich)
    assert instance.scored == 1500


@pytest.mark.parametrize("kind", ["raw-echo", "raw-work"])
def test_the_raw_ceiling_answers_every_row_in_order(spark: SparkSession, kind: str) -> None:
    """The ceiling's job has the same rows and columns: raw-work scores each row as the
    service does, raw-echo sends it back (its id as the score, its text as the label)."""
    with child(["--child", kind.removeprefix("raw-")]) as server:  # its stdin's end stops it
        port = str(answer(server)["port"])
        got = [tuple(row) for row in enriched(spark, port, kind, 1500, 4).collect()]
    if kind == "raw-work":
        assert got == [(i, text(i), *score_text(text(i))) for i in range(1500)]
    else:
        assert got == [(i, text(i), float(i), text(i)) for i in range(1500)]
