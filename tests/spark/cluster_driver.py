"""A driver of its own for test_cluster.py: ``call_service(key="id")`` over ``ROWS`` rows
against the recording service at ``argv[2]``, in the session ``spark-submit --master spark://...``
gives ``local_session()`` (``argv[1]`` is ``submit``) or through the Spark Connect server at
``argv[1]`` (``sc://host:port``); writes the rows it got to ``argv[3]`` as one JSON list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pairlink.spark import local_session
from tests.spark.test_call_service import rows, score

ROWS = 20_000
"""Enough for the job to run a few seconds on two cores past the kill."""
PARTITIONS = 8
"""Two tasks at a time on the worker's two cores: tasks run before and after the kill."""
IN_FLIGHT = 50


def main() -> None:
    session, url, output = sys.argv[1:]
    spark = (
        local_session(app_name="pairlink-cluster")
        if session == "submit"
        else SparkSession.builder.remote(session).getOrCreate()
    )
    try:
        got = score(rows(spark, ROWS, PARTITIONS), url, key="id", in_flight=IN_FLIGHT).collect()
        Path(output).write_text(json.dumps([list(row) for row in got]))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
