"""``benchmarks/spark.py`` compares like with like: its blocking baseline (one client per
partition) answers the same rows as ``call_service``, in order, with the same service work."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from benchmarks.spark import enriched, text
from pairlink.spark import serve_in_thread
from services.enrich import Enrich, score_text

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


@pytest.mark.parametrize("kind", ["spark", "blocking"])
def test_every_row_is_scored_once_in_input_order(spark: SparkSession, kind: str) -> None:
    with serve_in_thread(Enrich()) as server:
        got = [tuple(row) for row in enriched(spark, server.url, kind, 1500, 4).collect()]
        instance = server.hosted[0].instance
    assert got == [(i, text(i), *score_text(text(i))) for i in range(1500)]
    assert isinstance(instance, Enrich)
    assert instance.scored == 1500
