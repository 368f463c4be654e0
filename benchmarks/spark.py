"""Spark fan-out benchmark: rows/s through ``call_service`` against what a user would write
without it (one blocking client per partition), against the naive per-row approach and against a
plain single-process client (the ceiling), on the same data and service.

The enrichment service (``services/enrich.py``, duplicate detection on) runs in a process of
its own on 127.0.0.1 (port 0) for the whole run. Each round measures, in an order that rotates:

- spark: ``call_service(key="id", in_flight=200)`` over ``--rows`` rows in ``--partitions``
  partitions from ``local[2]``, the action a ``noop`` write (every row computed, nothing kept);
- blocking: what a PySpark user writes without ``call_service``, a ``mapInPandas`` whose task
  opens one blocking client (``pairlink._client.blocking``) and makes its rows' calls one at a
  time, over the same rows, partitions, columns, message-ids and ``noop`` write as spark;
- per-row: the naive approach, a Spark job whose tasks open a new blocking connection and make
  one call for every row, on a sample of ``--sample`` rows (it is slow: it measures mostly
  connection setup);
- ceiling: one process outside Spark, one connection, Trio with 200 calls in flight (with
  message-ids as ``key="id"`` makes them), over the same rows: what the service gives a caller
  with no Spark overhead at all.

Each figure is rows / wall time of the measured action, the median over ``--rounds`` rounds.
The last three lines are the ratios of the spark median to the ceiling's, to per-row's and to
blocking's (the one that says what ``call_service``'s pipelining is worth).

Run: ``python -m benchmarks.spark [--rounds N] [--rows N] [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import structlog
import trio

from benchmarks.rpc import alternate, run_main

ROOT = Path(__file__).resolve().parent.parent
TEXT = "the delivery was fast and the support great but the box arrived broken, row"
IN_FLIGHT = 200


def text(row: int) -> str:
    """Row ``row``'s text, as every approach sends it (Spark builds the same in SQL)."""
    return f"{TEXT} {row}"


# -- child processes ---------------------------------------------------------------------------


def serve_child() -> None:
    """The service process: prints its URL, serves until its stdin closes."""
    from pairlink import open_server
    from services.enrich import Enrich

    async def main() -> None:
        async with open_server(Enrich, listen="amqp://127.0.0.1:0") as server:
            print(json.dumps({"url": server.url}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)

    trio.run(main)


def ceiling_child(url: str, rows: int) -> None:
    """The single-process client: ``rows`` calls, ``IN_FLIGHT`` at a time; prints rows/s."""
    from pairlink import Client, connect

    run = uuid.uuid4().hex

    async def main() -> None:
        async with connect(url, reply_credit=2 * IN_FLIGHT) as client:
            limiter = trio.Semaphore(IN_FLIGHT)

            async def one(client: Client, row: int) -> None:
                try:
                    await client.call("enrich", "score", row, text(row), message_id=f"{run}:{row}")
                finally:
                    limiter.release()

            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for row in range(rows):
                    await limiter.acquire()
                    nursery.start_soon(one, client, row)
            print(json.dumps({"rate": rows / (time.perf_counter() - started)}), flush=True)

    trio.run(main)


def child(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.spark", *argv],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args!r} exited with status {proc.wait()}")
    message: dict[str, Any] = json.loads(line)
    return message


# -- the measurements --------------------------------------------------------------------------


def per_row_calls(url: str, rows: Iterable[Any]) -> Iterator[Any]:
    """A Spark task the naive way: a new blocking connection and one call for every row."""
    from pairlink import blocking

    for row in rows:
        with blocking.connect(url) as client:
            yield client.call("enrich", "score", row, text(row))


def blocking_calls(url: str, run: str, batches: Iterable[Any]) -> Iterator[Any]:
    """A ``mapInPandas`` task as a user writes it: one blocking client for the partition, one
    call per row, waiting for each reply before the next call."""
    from pairlink import blocking

    with blocking.connect(url) as client:
        for batch in batches:
            replies = [
                client.call("enrich", "score", row, text, message_id=f"{run}:{row}")
                for row, text in zip(batch["id"].tolist(), batch["text"].tolist(), strict=True)
            ]
            yield batch.assign(
                score=[reply["score"] for reply in replies],
                label=[reply["label"] for reply in replies],
            )


def enriched(spark: Any, url: str, kind: str, rows: int, partitions: int) -> Any:
    """The DataFrame ``kind`` ("spark" or "blocking") computes: ``rows`` rows in ``partitions``
    partitions, with their ``score`` and ``label`` columns."""
    from pairlink.spark import call_service

    df = spark.range(rows, numPartitions=partitions).selectExpr(
        "id", f"concat('{TEXT} ', id) as text"
    )
    if kind == "blocking":  # message-ids as key="id" makes them: the same service work
        return df.mapInPandas(
            functools.partial(blocking_calls, url, uuid.uuid4().hex),
            "id long, text string, score double, label string",
        )
    return call_service(
        df,
        url=url,
        address="enrich",
        operation="score",
        args=["id", "text"],
        result_schema="score double, label string",
        key="id",
        in_flight=IN_FLIGHT,
    )


def measure(spark: Any, url: str, kind: str, args: argparse.Namespace) -> float:
    if kind == "ceiling":
        proc = child(["--child", "ceiling", "--url", url, "--rows", str(args.rows)])
        try:
            return float(answer(proc)["rate"])
        finally:
            proc.wait()
    started = time.perf_counter()
    if kind == "per-row":
        sample = spark.sparkContext.parallelize(range(args.sample), args.partitions)
        count = sample.mapPartitions(functools.partial(per_row_calls, url)).count()
    else:
        df = enriched(spark, url, kind, args.rows, args.partitions)
        df.write.format("noop").mode("overwrite").save()
        count = args.rows
    return float(count) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per round (100,000)")
    parser.add_argument("--sample", type=int, default=600, help="per-row rows (600)")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions (4)")
    parser.add_argument("--quick", action="store_true", help="one small round, a smoke test")
    parser.add_argument("--child", choices=("serve", "ceiling"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.child == "serve":
        serve_child()
        return 0
    if args.child == "ceiling":
        ceiling_child(args.url, args.rows)
        return 0
    if args.quick:
        args.rounds, args.rows, args.sample = 1, 20_000, 200

    from pairlink.spark import local_session

    server = child(["--child", "serve"])
    try:
        url = answer(server)["url"]
        spark = local_session("local[2]", "pairlink-bench")
        spark.range(10, numPartitions=2).rdd.count()  # the Python workers start here
        kinds = ["spark", "blocking", "per-row", "ceiling"]
        rates, _ = alternate(
            kinds,
            args.rounds,
            lambda kind: measure(spark, url, kind, args),
            lambda kind, rate: f"{kind:<8} {rate:10,.0f} rows/s",
        )
        spark.stop()
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait()
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    print()
    print(
        f"enrich service, {args.rows:,} rows ({args.sample:,} per-row) in {args.partitions} "
        f"partitions, local[2], {IN_FLIGHT} in flight; medians of {args.rounds} round(s):"
    )
    for kind in kinds:
        print(f"  {kind:<8} {medians[kind]:10,.0f} rows/s")
    print(f"spark ratio vs ceiling: {medians['spark'] / medians['ceiling']:.2f}")
    print(f"spark ratio vs per-row: {medians['spark'] / medians['per-row']:.2f}")
    print(
        "spark ratio vs one blocking client per partition: "
        f"{medians['spark'] / medians['blocking']:.2f}"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
