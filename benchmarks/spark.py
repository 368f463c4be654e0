"""Spark fan-out benchmark: rows/s through ``call_service`` against the ceiling the machine
allows for the same Spark job (its rows through a raw Trio socket), against what a user would
write without it (one blocking client per partition), against the naive per-row approach and
against a plain single-process client, on the same data and service.

The enrichment service (``services/enrich.py``, duplicate detection on) runs in a process of
its own on 127.0.0.1 (port 0) for the whole run, and so does the raw echo server. Each round
measures, in an order that rotates:

- spark: ``call_service(key="id", in_flight=200)`` over ``--rows`` rows in ``--partitions``
  partitions from ``local[2]``, the action a ``noop`` write (every row computed, nothing kept),
  rows in batches of 256 (the default);
- spark-rows: the same with ``batch_rows=1``, each row a message of its own (what
  ``call_service`` did before batches);
- raw-echo: the ceiling, the same job shape (``mapInArrow`` over the same rows and partitions,
  the same output columns) whose tasks send each row, msgpack-packed in a length-prefixed frame,
  through one raw Trio socket per task to an echo server (Trio, one process), with ``200``
  rows in flight: no AMQP, no service framework, no handler;
- raw-work: the same, the echo server scoring each row as the service does (``score_text``)
  before answering: the ceiling of this job's work, without pairlink;
- blocking: what a PySpark user writes without ``call_service``, a ``mapInPandas`` whose task
  opens one blocking client (``pairlink._client.blocking``) and makes its rows' calls one at a
  time, over the same rows, partitions, columns, message-ids and ``noop`` write as spark;
- per-row: the naive approach, a Spark job whose tasks open a new blocking connection and make
  one call for every row, on a sample of ``--sample`` rows (it is slow: it measures mostly
  connection setup);
- client: one process outside Spark, one connection, Trio with 200 calls in flight (with
  message-ids as ``key="id"`` makes them), a call per row, over the same rows: what the
  service gives a caller of single calls with no Spark overhead at all.

Each figure is rows / wall time of the measured action, the median over ``--rounds`` rounds.
The last lines are ``call_service``'s rows/s as a fraction of the ceiling (raw-echo, and
raw-work), and its ratios to per-row's, to blocking's (what pipelining is worth) and to
spark-rows' (what batches are worth).

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

import msgpack
import structlog
import trio

from benchmarks.rpc import alternate, run_main
from pairlink._rpc.batch import DEFAULT_BATCH_ROWS

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


def echo_child(work: bool) -> None:
    """The raw echo server: prints its port, answers every length-prefixed frame of every
    connection with a frame (the same bytes; with ``work``, the row's score and label), until
    its stdin closes. It answers all the frames a read brought in one write: the window."""
    from services.enrich import score_text

    def answer(frame: bytes) -> bytes:
        if not work:
            return frame
        _, line = msgpack.unpackb(frame)
        packed: bytes = msgpack.packb(score_text(line))
        return packed

    async def echo(stream: trio.SocketStream) -> None:
        pending = b""
        async for data in stream:
            pending += data
            out, at = bytearray(), 0
            while len(pending) - at >= FRAME:
                size = int.from_bytes(pending[at : at + FRAME])
                if len(pending) - at - FRAME < size:
                    break
                reply = answer(pending[at + FRAME : at + FRAME + size])
                out += len(reply).to_bytes(FRAME) + reply
                at += FRAME + size
            pending = pending[at:]
            if out:
                await stream.send_all(out)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1")
            (listener,) = await nursery.start(serve)
            print(json.dumps({"port": listener.socket.getsockname()[1]}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()

    trio.run(main)


FRAME = 4
"""Bytes of a raw frame's length prefix (big-endian; ``int.from_bytes``, as a ``Struct``
does not pickle into Spark's closure)."""


def raw_calls(port: int, work: bool, batches: Iterator[Any]) -> Iterator[Any]:
    """A ``mapInArrow`` task of the ceiling: each Arrow batch's rows (10,000) sent as frames
    through a Trio socket to the echo server (a connection per batch: a millisecond in a
    second's work), ``IN_FLIGHT`` rows in flight, their answers read back in order into the
    same output columns as ``call_service``'s. The window is kept full as a tuned raw client
    would: whatever room the answers free is filled with one write of that many frames."""
    import pyarrow as pa

    async def exchange(rows: list[tuple[int, str]]) -> list[Any]:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        answers: list[Any] = []
        room = trio.Event()

        async def send() -> None:
            nonlocal room
            sent = 0
            while sent < len(rows):
                free = IN_FLIGHT - (sent - len(answers))
                if free <= 0:
                    await room.wait()
                    room = trio.Event()
                    continue
                frames = [msgpack.packb(row) for row in rows[sent : sent + free]]
                await stream.send_all(b"".join(len(f).to_bytes(FRAME) + f for f in frames))
                sent += len(frames)

        async def receive() -> None:
            pending = b""
            while len(answers) < len(rows):
                pending += await stream.receive_some()
                at = 0
                while len(pending) - at >= FRAME:
                    size = int.from_bytes(pending[at : at + FRAME])
                    if len(pending) - at - FRAME < size:
                        break
                    answers.append(msgpack.unpackb(pending[at + FRAME : at + FRAME + size]))
                    at += FRAME + size
                pending = pending[at:]
                room.set()

        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(receive)
        return answers

    for batch in batches:
        ids = batch.column("id").to_pylist()
        rows = list(zip(ids, batch.column("text").to_pylist(), strict=True))
        answers = trio.run(exchange, rows)
        if work:  # [score, label]
            scores, labels = [a[0] for a in answers], [a[1] for a in answers]
        else:  # the row itself: [id, text]
            scores, labels = [float(a[0]) for a in answers], [a[1] for a in answers]
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(scores, pa.float64()), pa.array(labels, pa.string())],
            names=[*batch.schema.names, "score", "label"],
        )


def client_child(url: str, rows: int) -> None:
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
    """The DataFrame ``kind`` ("spark", "spark-rows", "blocking"; "raw-echo" or "raw-work",
    whose ``url`` is the echo server's port) computes: ``rows`` rows in ``partitions``
    partitions, with their ``score`` and ``label`` columns."""
    from pairlink.spark import call_service

    df = spark.range(rows, numPartitions=partitions).selectExpr(
        "id", f"concat('{TEXT} ', id) as text"
    )
    schema = "id long, text string, score double, label string"
    if kind == "blocking":  # message-ids as key="id" makes them: the same service work
        return df.mapInPandas(functools.partial(blocking_calls, url, uuid.uuid4().hex), schema)
    if kind.startswith("raw-"):
        return df.mapInArrow(functools.partial(raw_calls, int(url), kind == "raw-work"), schema)
    return call_service(
        df,
        url=url,
        address="enrich",
        operation="score",
        args=["id", "text"],
        result_schema="score double, label string",
        key="id",
        in_flight=IN_FLIGHT,
        batch_rows=1 if kind == "spark-rows" else DEFAULT_BATCH_ROWS,
    )


def measure(spark: Any, urls: dict[str, str], kind: str, args: argparse.Namespace) -> float:
    url = urls.get(kind, urls["service"])
    if kind == "client":
        proc = child(["--child", "client", "--url", url, "--rows", str(args.rows)])
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
    parser.add_argument(
        "--child", choices=("serve", "client", "echo", "work"), help=argparse.SUPPRESS
    )
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.child == "serve":
        serve_child()
        return 0
    if args.child == "client":
        client_child(args.url, args.rows)
        return 0
    if args.child in ("echo", "work"):
        echo_child(work=args.child == "work")
        return 0
    if args.quick:
        args.rounds, args.rows, args.sample = 1, 20_000, 200

    from pairlink.spark import local_session

    servers = {name: child(["--child", name]) for name in ("serve", "echo", "work")}
    try:
        urls = {
            "service": answer(servers["serve"])["url"],
            "raw-echo": str(answer(servers["echo"])["port"]),
            "raw-work": str(answer(servers["work"])["port"]),
        }
        spark = local_session("local[2]", "pairlink-bench")
        spark.range(10, numPartitions=2).rdd.count()  # the Python workers start here
        kinds = ["spark", "spark-rows", "raw-echo", "raw-work", "blocking", "per-row", "client"]
        rates, _ = alternate(
            kinds,
            args.rounds,
            lambda kind: measure(spark, urls, kind, args),
            lambda kind, rate: f"{kind:<10} {rate:10,.0f} rows/s",
        )
        spark.stop()
    finally:
        for server in servers.values():
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
        print(f"  {kind:<10} {medians[kind]:10,.0f} rows/s")
    batched = medians["spark"]
    print(
        "call_service rows/s as a fraction of the ceiling (raw-echo): "
        f"{batched / medians['raw-echo']:.2f}"
    )
    print(f"call_service rows/s as a fraction of raw-work: {batched / medians['raw-work']:.2f}")
    print(f"spark ratio vs spark-rows (batches of one): {batched / medians['spark-rows']:.2f}")
    print(f"spark ratio vs single calls from one process: {batched / medians['client']:.2f}")
    print(f"spark ratio vs per-row: {medians['spark'] / medians['per-row']:.2f}")
    print(
        "spark ratio vs one blocking client per partition: "
        f"{medians['spark'] / medians['blocking']:.2f}"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
