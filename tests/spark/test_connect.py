"""Progress under Spark Connect, for real: a local Connect server, in a driver of its own.

Skipped where Connect's client dependencies (grpcio-status, googleapis-common-protos,
protobuf, zstandard) are not installed: pyspark refuses to open a Connect session then."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pairlink._spark.progress import CONNECT_OFF


def connect_missing() -> str | None:
    """Why a Connect session cannot be opened here, or None."""
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        return str(exc)
    return None


CONNECT_MISSING = connect_missing()


@pytest.mark.skipif(CONNECT_MISSING is not None, reason=f"Spark Connect: {CONNECT_MISSING}")
def test_progress_counts_rows_under_connect_or_says_in_one_line_it_is_off() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_driver"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["session"] == "pyspark.sql.connect.session"
    counted = found["side_channel=True"]
    assert (counted["rows"], counted["right"], counted["counted"]) == (2000, True, 2000)
    assert "100.0%  2,000/2,000 rows" in counted["lines"][-1]
    off = found["side_channel=False"]
    assert (off["rows"], off["right"], off["counted"]) == (2000, True, 0)
    assert off["lines"] == [CONNECT_OFF]
