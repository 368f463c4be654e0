"""The main job: a million rows enriched by a pairlink service, fanned out from Spark.

Run it with ``make demo`` (or ``.venv/bin/python -m examples.spark_enrich [--rows N]``). It
starts the enrichment service (``services/enrich.py``), generates review-like texts in Spark
(``local[2]``), scores every row through ``call_service`` with a live progress bar, writes the
result to Parquet, then prints the throughput, a sample and the label counts, and shuts
everything down. ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` are set by ``local_session``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

from examples.org_chain import org_chain
from pairlink.spark import Progress, call_service, local_session, serve_in_thread
from services.enrich import LEXICON, Enrich

WORDS = (
    *LEXICON,  # the words the service scores, and filler around them
    *("the", "delivery", "box", "support", "product", "service", "refund", "experience"),
    *("was", "is", "and", "but", "it", "this", "at", "all", "again", "not", "never"),
)


@contextmanager
def start_service_chain(direct: bool) -> Iterator[str]:
    """Serve the enrichment service and yield the URL the Spark tasks call it at: through the
    two-organisation gateway chain (organisation N's gateway, then O's, then O's container:
    ``org_chain``), or ``direct`` from a thread of this process."""
    if direct:
        with serve_in_thread(Enrich(), listen="amqp://127.0.0.1:0") as server:
            yield server.url
    else:
        with org_chain(Enrich(), public="enrich") as url:
            yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to enrich (1,000,000)")
    parser.add_argument("--partitions", type=int, default=8, help="Spark partitions (8)")
    parser.add_argument(
        "--in-flight", type=int, default=200, help="messages (batches) in flight per task (200)"
    )
    parser.add_argument(
        "--batch-rows", type=int, default=256, help="rows to a message (256, as call_service)"
    )
    parser.add_argument(
        "--direct", action="store_true", help="call the service directly, not through gateways"
    )
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    began = time.perf_counter()
    spark = local_session(app_name="pairlink-demo")
    print(f"Spark {spark.version} started in {time.perf_counter() - began:.1f} s")
    try:
        with start_service_chain(args.direct) as url, tempfile.TemporaryDirectory() as folder:
            where = "directly" if args.direct else "through gateways GN -> GO -> CO"
            print(f"calling the enrichment service {where}")
            words = ", ".join(f"'{w}'" for w in WORDS)
            picks = ", ".join(
                f"element_at(words, cast(abs(hash(id, {k})) % {len(WORDS)} as int) + 1)"
                for k in range(8)
            )
            df = (
                spark.range(args.rows, numPartitions=args.partitions)
                .selectExpr("id", f"array({words}) as words")
                .selectExpr("id", f"concat_ws(' ', {picks}) as text")
            )
            started = time.perf_counter()
            with Progress(spark, total=args.rows) as progress:
                enriched = call_service(
                    df,
                    url=url,
                    address="enrich",
                    operation="score",
                    args=["id", "text"],
                    result_schema="score double, label string",
                    key="id",
                    in_flight=args.in_flight,
                    batch_rows=args.batch_rows,
                    progress=progress,
                )
                enriched.write.parquet(f"{folder}/enriched")
            elapsed = time.perf_counter() - started
            result = spark.read.parquet(f"{folder}/enriched")
            written = result.count()
            print(
                f"\nenriched {written:,} rows in {elapsed:.1f} s: "
                f"{written / elapsed:,.0f} rows/s ({progress.errors:,} errors)"
            )
            print("a sample:")
            for row in result.orderBy("id").limit(5).collect():
                print(f"  {row.id:>7}  {row.score:+.3f}  {row.label:<8}  {row.text}")
            print("labels:")
            for row in result.groupBy("label").count().orderBy("label").collect():
                print(f"  {row.label:<8} {row['count']:>9,}")
            if written != args.rows or progress.errors:
                print(f"expected {args.rows:,} rows and no errors", file=sys.stderr)
                return 1
    finally:
        spark.stop()
    print(f"done in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
