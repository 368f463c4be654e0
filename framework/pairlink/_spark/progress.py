"""Live progress of a fan-out on the driver: rows answered / total, rows/s, errors.

Row counts come from the tasks themselves, over pairlink: the driver serves a small service
(``pairlink.progress``) on its own address (``spark.driver.host``, a free port), and every task
that calls a service also opens a connection to it and reports its running counts every
``REPORT_EVERY`` seconds and when it ends (that end is _reporter.py). That works wherever
executors run, as long as they can reach the driver (Spark's own RPC needs that too). Reports
are cumulative per task attempt, so a lost or repeated report changes nothing and a retried
task's count replaces its failed attempt's. Reporting runs in a task of its own beside the
calls, so it never delays them; a task that cannot reach the driver logs it once and goes on
without reporting.

When no row counts arrive (the side channel unreachable, or turned off) the bar falls back to
what Spark's ``statusTracker`` knows: tasks completed of the job's stages. A Spark Connect
session has no SparkContext on the client, so no status tracker and no job group: there the
rows are all the bar shows, and with ``side_channel=False`` it says in one line that it is off.

The bar goes to stderr: redrawn in place (``\\r``) on a terminal, a log line every
``log_every`` seconds otherwise (a CI log, a file).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from typing import IO, TYPE_CHECKING, Literal

from pairlink._server.service import handler, service
from pairlink._spark._reporter import ADDRESS
from pairlink._spark.background import serve_in_thread

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

BAR_WIDTH = 30
Mode = Literal["rows", "tasks"]
CONNECT_OFF = (
    "progress off: a Spark Connect session has no task counts, and side_channel=False"
    " turns off row counts"
)


def spark_context(spark: SparkSession) -> SparkContext | None:
    """The session's SparkContext; None for a Spark Connect session, a client of a remote
    driver, where reading ``sparkContext`` raises. By its class's module, not an import of
    ``pyspark.sql.connect``, which fails without Connect's own dependencies."""
    if type(spark).__module__.startswith("pyspark.sql.connect."):
        return None
    return spark.sparkContext


@service(ADDRESS, max_concurrency=1, mailbox=1024)
class Tally:
    """The driver's side channel: the latest counts of every task attempt."""

    def __init__(self) -> None:
        # (run, stage, partition) -> (attempt, rows, errors)
        self.tasks: dict[tuple[str, int, int], tuple[int, int, int]] = {}

    @handler(inline=True)  # a few counters: no worker thread needed
    def update(
        self, run: str, stage: int, partition: int, attempt: int, rows: int, errors: int
    ) -> None:
        key = (run, stage, partition)
        known = self.tasks.get(key)
        if known is None or attempt >= known[0]:
            self.tasks[key] = (attempt, rows, errors)

    def totals(self) -> tuple[int, int]:
        """Rows answered and errors, over the latest attempt of every task."""
        counts = list(self.tasks.values())  # a copy: the server thread may add to it
        return sum(c[1] for c in counts), sum(c[2] for c in counts)


class Progress:
    """A progress bar for the Spark jobs run inside the ``with`` block::

        with Progress(spark, total=df.count()) as progress:
            out = call_service(df, ..., progress=progress)
            out.write.parquet(path)

    ``total``: rows expected (None: no percentage). ``host``: the address to listen on
    (default ``spark.driver.host``; with Spark Connect 127.0.0.1, as the Connect server's
    tasks must reach this process); ``advertise``: the URL tasks report to, if they must
    reach the driver by another name (NAT, a proxy); ``side_channel=False``: task-level
    progress only (with Spark Connect none: one line says so). ``stream``: where the bar
    goes (stderr). The jobs are recognised by a job group set for the block's thread (the
    previous one is restored on exit).
    """

    def __init__(
        self,
        spark: SparkSession,
        total: int | None = None,
        *,
        host: str | None = None,
        advertise: str | None = None,
        side_channel: bool = True,
        every: float = 0.25,
        log_every: float = 5.0,
        stream: IO[str] | None = None,
    ) -> None:
        self.spark = spark
        self.total = total
        self.host = host
        self.advertise = advertise
        self.side_channel = side_channel
        self.every = every
        self.log_every = log_every
        self.stream = stream if stream is not None else sys.stderr
        self.url: str | None = None
        """Where tasks report: ``call_service(progress=...)`` passes it on."""
        self.tally = Tally()
        self.group = f"pairlink-{uuid.uuid4().hex[:12]}"
        self._stack = ExitStack()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._tty = False
        self._context = spark_context(spark)

    # -- what is known -----------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return self.tally.totals()[0]

    @property
    def errors(self) -> int:
        return self.tally.totals()[1]

    def tasks(self) -> tuple[int, int]:
        """(completed, total) tasks of the block's jobs, from Spark's status tracker
        ((0, 0) with Spark Connect, which has none)."""
        if self._context is None:
            return 0, 0
        tracker = self._context.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    @property
    def mode(self) -> Mode:
        """``rows`` once any task has reported, else ``tasks``."""
        return "rows" if self.tally.tasks else "tasks"

    def line(self) -> str:
        """The bar as text, from what is known now."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        if self.mode == "tasks" and self._context is None:
            return f"no row counts yet ({elapsed:,.0f} s; Spark Connect has no task counts)"
        if self.mode == "tasks":
            done, total = self.tasks()
            return f"tasks {done:,}/{total:,} done  ({elapsed:,.0f} s, no row counts yet)"
        rows, errors = self.tally.totals()
        rate = rows / elapsed
        text = f"{rows:,} rows  {rate:,.0f} rows/s  {errors:,} errors"
        if self.total:
            share = min(1.0, rows / self.total)
            filled = math.floor(share * BAR_WIDTH)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            left = (self.total - rows) / rate if rate > 0 else math.inf
            eta = f"  eta {left:,.0f} s" if math.isfinite(left) and rows < self.total else ""
            text = f"[{bar}] {share:6.1%}  {rows:,}/{self.total:,} rows  {rate:,.0f} rows/s"
            text += f"  {errors:,} errors{eta}"
        return text

    # -- the block ---------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        context = self._context
        if context is None and not self.side_channel:
            self.stream.write(f"{CONNECT_OFF}\n")
            self.stream.flush()
            return self
        try:
            if self.side_channel:
                driver = context.getConf().get("spark.driver.host") if context else None
                host = self.host or driver or "127.0.0.1"
                server = self._stack.enter_context(
                    serve_in_thread(self.tally, listen=f"amqp://{host}:0")
                )
                self.url = self.advertise or f"amqp://{host}:{server.port}"
            if context is not None:
                previous = context.getLocalProperty("spark.jobGroup.id")
                context.setLocalProperty("spark.jobGroup.id", self.group)
                self._stack.callback(context.setLocalProperty, "spark.jobGroup.id", previous)  # type: ignore[arg-type]
            self._tty = self.stream.isatty()
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._render, name="pairlink-progress")
            self._thread.daemon = True
            self._thread.start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is None:  # off from the start: said so in __enter__
            return
        self._stop.set()
        self._thread.join()
        self._show(final=True)
        self._stack.close()

    def _render(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(self.every):
            if self._tty:
                self._show()
            elif time.monotonic() - last_log >= self.log_every:
                last_log = time.monotonic()
                self._show()

    def _show(self, *, final: bool = False) -> None:
        text = self.line()
        if self._tty:
            self.stream.write(f"\r{text}\x1b[K" + ("\n" if final else ""))
            self.stream.flush()
        else:
            self.stream.write(f"progress: {text}\n")
            self.stream.flush()
