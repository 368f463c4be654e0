"""The examples run as the README says: smallest script, and the main job on a small scale;
their services tested as users test theirs, in memory (``pairlink.testing``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from examples.calc import Calculator
from pairlink import RemoteError
from pairlink.testing import serve_in_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(60)
def test_the_calculator_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "calc.py")],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "add(1, 2) = 3" in done.stdout.splitlines()
    assert "div(1, 0) failed remotely: status 500, ZeroDivisionError" in done.stdout


async def test_the_calculator_answers_in_memory() -> None:
    async with serve_in_memory(Calculator) as client:
        calc = await client.service("calc")
        assert await calc.add(1, 2) == 3
        assert await calc.call("mul", 2.0, 4.0) == 8.0
        with pytest.raises(RemoteError) as caught:
            await calc.div(1, 0)
        assert (caught.value.status, caught.value.type) == (500, "ZeroDivisionError")


def run_spark_example(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the checkout, which must exit 0 within 220 s."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_the_demo_enriches_through_the_gateway_chain() -> None:
    """``make demo`` on 3,000 rows: Spark, the org chain (three processes), the progress
    bar; it exits 0 only if every row came back without error."""
    done = run_spark_example("examples.spark_enrich", "--rows", "3000", "--partitions", "2")
    assert "calling the enrichment service through gateways GN -> GO -> CO" in done.stdout
    assert "enriched 3,000 rows in" in done.stdout and "(0 errors)" in done.stdout
    assert "3,000/3,000 rows" in done.stderr  # the progress bar, row-level


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_the_streaming_example_restarts_its_query_without_repeating_an_effect() -> None:
    """``examples.spark_stream`` on 2,000 rows: stopped in batch 1, restarted, each row run
    once; it exits 0 only if the output holds every row once and the service ran each once."""
    done = run_spark_example("examples.spark_stream", "--rows", "2000")
    assert done.stdout.splitlines() == [
        "the query stopped in batch 1 after its calls and its write, before its commit",
        "before the restart: the service ran 1,000 rows",
        "after the restart from the checkpoint: 2,000 rows written (2,000 distinct ids) of 2,000;"
        " the service ran 2,000 rows and answered 2 repeated messages (batches of rows) from its"
        " dedup store",
    ]
