"""call_service on a real Spark standalone cluster (a master and a worker from the installed
pyspark, on 127.0.0.1) and through a Spark Connect server running on it, each job losing
processes to SIGKILL mid-job: an executor's JVM under ``spark-submit``, the Python workers of
the tasks under Connect. Spark re-runs the lost tasks, which send their rows again with the
same ids (``key="id"``); the recording service runs each row once and every row comes back
right. The drivers are processes of their own (tests/spark/cluster_driver.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio

from tests.service_peers import wait_for
from tests.spark.cluster import (
    BIN,
    Cluster,
    Process,
    connect_server,
    kill,
    standalone,
    started,
    submit,
)
from tests.spark.cluster_driver import ROWS
from tests.spark.recorder import Served, expected
from tests.spark.test_connect import CONNECT_MISSING

MISSING = [name for name in ("spark-class", "spark-submit") if not (BIN / name).exists()]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(180),
    pytest.mark.skipif(bool(MISSING), reason=f"pyspark's {MISSING} not next to {BIN}"),
]

KILL_AFTER = 3000
"""Rows the service has run when the kill comes: the job is under way, most rows to go."""
DRIVER = Path(__file__).with_name("cluster_driver.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone(tmp_path_factory.mktemp("cluster")) as running:
        yield running


async def killed_mid_job(
    driver: Process, recorder: Served, output: Path, victims: Callable[[], list[int]]
) -> list[int]:
    """Once the service has run ``KILL_AFTER`` rows, SIGKILL the processes ``victims()``
    names (each must exist and die); then the driver must end well, every row right and run
    once, some sent again (the dedup store answered them). The PIDs killed."""
    ended = driver.popen.poll
    await wait_for(lambda: len(recorder.service.runs) >= KILL_AFTER or ended() is not None, 90)
    assert ended() is None, "".join(driver.lines[-60:])  # it is still running the job
    pids = victims()
    assert pids, "nothing to kill"
    for pid in pids:
        kill(pid)
    assert len(recorder.service.runs) < ROWS  # killed mid-job, not after it
    status = await trio.to_thread.run_sync(driver.wait, 60)
    assert status == 0, "".join(driver.lines[-60:])
    got = json.loads(await trio.Path(output).read_text())
    assert got == [[i, f"row {i}", *expected(i)] for i in range(ROWS)]  # 0 rows wrong
    assert recorder.service.runs == dict.fromkeys(range(ROWS), 1)  # none missing, none twice
    assert recorder.dedup_hits >= 1  # the re-run tasks' rows reached the service again
    return pids


async def test_a_job_on_a_standalone_cluster_survives_its_executor_killed(
    cluster: Cluster, recorder: Served, tmp_path: Path
) -> None:
    output = tmp_path / "rows.json"
    with ExitStack() as stack:
        driver = submit(
            stack, tmp_path, "pairlink-cluster", cluster.url, str(DRIVER), "submit",
            recorder.url, str(output),
        )  # fmt: skip
        await killed_mid_job(driver, recorder, output, cluster.executors)
    # the worker launched a second executor for the application, which ran the lost tasks
    launched = cluster.worker.expect(r"Asked to launch executor (app-[-\d]+)/1 for pairlink-cl")
    assert f"{launched[1]}/0" in "".join(cluster.worker.lines)


@pytest.mark.skipif(CONNECT_MISSING is not None, reason=f"Spark Connect: {CONNECT_MISSING}")
async def test_a_job_through_spark_connect_survives_its_python_workers_killed(
    cluster: Cluster, recorder: Served, tmp_path: Path
) -> None:
    output = tmp_path / "rows.json"
    with connect_server(cluster) as remote, ExitStack() as stack:
        driver = started(
            stack, tmp_path, "the Connect driver",
            [sys.executable, str(DRIVER), remote, recorder.url, str(output)],
        )  # fmt: skip
        executors: list[int] = []

        def python_workers() -> list[int]:
            executors.extend(cluster.executors())
            return cluster.python_workers()

        await killed_mid_job(driver, recorder, output, python_workers)
        assert cluster.executors() == executors  # it lived on: its tasks were retried in it
