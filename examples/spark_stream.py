"""A stream enriched by a pairlink service, exactly once across a restart of the query.

Run it with ``.venv/bin/python -m examples.spark_stream [--rows N] [--files F]``. It writes
review-like rows as JSON files, streams them (a file per micro-batch) through the README's
``foreachBatch`` recipe into Parquet, stops the query in its second micro-batch after that
batch's calls and write but before Spark commits it (as a crash there would), restarts it from
the same checkpoint, and shows that the service ran each row once: the replayed batch's calls
carry the ids they carried before, and the service answers them from its dedup store.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import structlog
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from pairlink.spark import call_service, local_session, serve_in_thread
from services.enrich import Enrich

QUERY = "reviews-enrich"
"""This query's name, in its calls' ids: the same on every restart, another query's not."""
TEXTS = ("great service", "never again", "not bad at all", "slow delivery but friendly support")


class Stopped(Exception):
    """Raised in a micro-batch after its work, before its commit: a crash at the worst time."""


def enrich_batches(url: str, out: Path, stop_in: int | None) -> Callable[[DataFrame, int], None]:
    """The recipe's ``foreachBatch`` function (stopping in batch ``stop_in``)."""

    def enrich_batch(batch: DataFrame, batch_id: int) -> None:
        enriched = call_service(
            batch,
            url=url,
            address="enrich",
            operation="score",
            args=["id", "text"],
            result_schema="score double, label string",
            key="id",  # the row's id in this batch: the same ids when the batch runs again
            run_id=f"{QUERY}:{batch_id}",
        )
        enriched.write.mode("overwrite").parquet(str(out / f"batch_id={batch_id}"))
        if batch_id == stop_in:
            raise Stopped(f"stopped in batch {batch_id}, after its calls and its write")

    return enrich_batch


def run_query(spark: SparkSession, work: Path, url: str, stop_in: int | None) -> None:
    """Stream every input file not yet committed in the checkpoint, then stop."""
    query = (
        spark.readStream.schema("id long, text string")
        .option("maxFilesPerTrigger", 1)
        .json(str(work / "in"))
        .writeStream.foreachBatch(enrich_batches(url, work / "out", stop_in))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def write_reviews(folder: Path, rows: int, files: int) -> None:
    folder.mkdir()
    for file in range(files):
        ids = range(file * rows // files, (file + 1) * rows // files)
        lines = (json.dumps({"id": i, "text": TEXTS[i % len(TEXTS)]}) for i in ids)
        (folder / f"reviews-{file}.json").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows to stream (10,000)")
    parser.add_argument("--files", type=int, default=4, help="input files, one a batch (4)")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    spark = local_session(app_name="pairlink-stream")
    service = Enrich()
    with tempfile.TemporaryDirectory() as folder, serve_in_thread(service) as server:
        work = Path(folder)
        write_reviews(work / "in", args.rows, args.files)
        # py4j and Spark log the Stopped raised on purpose, tracebacks and all: quiet them
        py4j = logging.getLogger("py4j.clientserver")
        py4j.disabled = True
        spark.sparkContext.setLogLevel("OFF")
        try:
            run_query(spark, work, server.url, stop_in=1)
        except StreamingQueryException as exc:
            if "Stopped: stopped in batch 1" not in str(exc):
                raise
            print("the query stopped in batch 1 after its calls and its write, before its commit")
        finally:
            py4j.disabled = False
            spark.sparkContext.setLogLevel("ERROR")
        print(f"before the restart: the service ran {service.scored:,} rows")
        run_query(spark, work, server.url, stop_in=None)
        dedup = server.actors["enrich"].dedup
        assert dedup is not None  # Enrich declares dedup_window
        out = spark.read.parquet(str(work / "out"))
        written, distinct = out.count(), out.select("id").distinct().count()
        print(
            f"after the restart from the checkpoint: {written:,} rows written "
            f"({distinct:,} distinct ids) of {args.rows:,}; the service ran {service.scored:,} "
            f"rows and answered {dedup.hits:,} repeated messages (batches of rows) from its "
            "dedup store"
        )
    spark.stop()
    return 0 if written == distinct == args.rows == service.scored else 1


if __name__ == "__main__":
    raise SystemExit(main())
