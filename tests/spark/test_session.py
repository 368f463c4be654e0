"""Which master ``local_session`` picks: the one Spark was launched with, else local[2].

Each case starts a driver of its own (a JVM, a few seconds), since a process has one
SparkContext and the other Spark tests share theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pairlink.spark import local_session

SCRIPT = "from pairlink.spark import local_session; print(local_session().sparkContext.master)"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


def master_in(tmp_path: Path, submit: list[str] | None, env: dict[str, str]) -> str:
    """The master of ``local_session()`` in a fresh driver, run by python or spark-submit."""
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "MASTER")}
    environ.update(PYSPARK_PYTHON=sys.executable, **env)
    command = [str(SPARK_SUBMIT), *submit] if submit is not None else [sys.executable]
    done = subprocess.run(
        [*command, str(script)], env=environ, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("submit", "env", "expected"),
    [
        (["--master", "local[3]"], {}, "local[3]"),
        (None, {"PYSPARK_SUBMIT_ARGS": "--master local[3] pyspark-shell"}, "local[3]"),
        (None, {}, "local[2]"),  # not Spark's own fallback, local[*]
    ],
    ids=["spark-submit", "PYSPARK_SUBMIT_ARGS", "nothing"],
)
def test_the_master_spark_was_launched_with_wins_over_the_default(
    tmp_path: Path, submit: list[str] | None, env: dict[str, str], expected: str
) -> None:
    assert master_in(tmp_path, submit, env) == expected


def test_an_active_session_is_returned_as_it_is(spark: SparkSession) -> None:
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    again = local_session("local[3]", **{"spark.sql.shuffle.partitions": "7"})
    assert again is spark
    assert again.sparkContext.master == "local[2,4]"
    assert spark.conf.get("spark.sql.shuffle.partitions") == partitions
