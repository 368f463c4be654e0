"""A driver of its own through Spark Connect (a local server that ``remote("local[2]")``
starts): ``call_service`` with a ``Progress``, side channel on and off; prints what happened
as one JSON line. Run by test_connect.py in a subprocess: a process has one Spark."""

from __future__ import annotations

import io
import json
import os
import sys

from pyspark.sql import SparkSession

from pairlink.spark import Progress, serve_in_thread
from tests.spark.recorder import Recorder
from tests.spark.test_call_service import rows, score


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    found: dict[str, object] = {"session": type(spark).__module__}
    try:
        with serve_in_thread(Recorder()) as server:
            for side_channel in (True, False):
                stream = io.StringIO()
                with Progress(spark, total=2000, side_channel=side_channel, stream=stream) as p:
                    got = score(rows(spark, 2000), server.url, progress=p).collect()
                found[f"side_channel={side_channel}"] = {
                    "rows": len(got),
                    "right": all(r["label"] == r["text"].upper() for r in got),
                    "counted": p.rows,
                    "lines": stream.getvalue().splitlines(),
                }
    finally:
        spark.stop()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
