"""One SparkSession for every Spark test (a session takes ~5 s to start), and a recording
service the tests call, served from a thread of the test process over real TCP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pairlink.spark import local_session, serve_in_thread
from tests.spark.recorder import Recorder, Served


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """``local[2,4]``: two cores, and a failed task is tried up to 4 times, as on a cluster
    (plain ``local[2]`` never retries), so a test can watch a task's second attempt. Arrow
    batches of 500 rows: a partition is several batches, as in real jobs."""
    session = local_session(
        "local[2,4]",
        "pairlink-tests",
        **{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"},
    )
    yield session
    session.stop()


@pytest.fixture
def recorder() -> Iterator[Served]:
    """A fresh ``Recorder``, served."""
    with serve_in_thread(Recorder(), listen="amqp://127.0.0.1:0") as server:
        instance = server.hosted[0].instance
        assert isinstance(instance, Recorder)
        yield Served(instance, server)
