"""A task's end of the progress side channel (progress.py has the driver's end): the task's
running counts, reported to the driver's ``pairlink.progress`` service.

Apart from progress.py so that a task, which reports, imports none of the driver's bar and
server, and the driver's end imports nothing of the task's; both take ``ADDRESS`` from here.
"""

from __future__ import annotations

import attrs
import trio

from pairlink._client.client import connect
from pairlink._telemetry.logs import get_logger
from pairlink.errors import PairlinkError

log = get_logger("pairlink.spark")

ADDRESS = "pairlink.progress"
REPORT_EVERY = 0.2
"""Seconds between a task's reports: a few per second is live enough for a person watching."""


@attrs.define
class Counts:
    """Rows of this task answered so far, and how many of them with an error."""

    rows: int = 0
    errors: int = 0


def task_identity() -> tuple[int, int, int]:
    """(stage, partition, attempt) of the running Spark task; zeros outside Spark."""
    from pyspark import TaskContext  # here, not at the top: importing pairlink._spark is light

    context = TaskContext.get()
    if context is None:
        return 0, 0, 0
    return context.stageId(), context.partitionId(), context.attemptNumber()


async def report(url: str, run_id: str, counts: Counts, finished: trio.Event) -> None:
    """Report ``counts`` to the driver at ``url``, every ``REPORT_EVERY`` s and once more
    when ``finished`` is set. A driver that cannot be reached is logged once, and the task
    goes on without reporting."""
    stage, partition, attempt = task_identity()
    try:
        async with connect(url, timeout=5.0, connect_timeout=2.0) as client:
            sent: tuple[int, int] | None = None
            while True:
                with trio.move_on_after(REPORT_EVERY):
                    await finished.wait()
                last = finished.is_set()  # read before the counts: they are final then
                now = (counts.rows, counts.errors)
                if now != sent:
                    await client.call(ADDRESS, "update", run_id, stage, partition, attempt, *now)
                    sent = now
                if last:
                    return
    except (OSError, TimeoutError, PairlinkError) as exc:
        log.warning("spark.progress_unreachable", url=url, error=str(exc))
