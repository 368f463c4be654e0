"""The attack benchmark's issue 22 rows run: the short ones end to end (``--quick``, each
against a fresh server process of its own), printing the verdicts the closing note cites."""

from __future__ import annotations

import re
import subprocess
import sys

from benchmarks.attacks.attacks import ATTACKS
from benchmarks.rpc import ROOT

ISSUE_22_ROWS = (
    "dedup-cross-caller",
    "dedup-memory",
    "gateway-no-route",
    "links-per-process",
    "metrics-scrape",
    "running-slots",
    "connect-deadline",
    "worker-stop",
    "health-route",
    "gateway-pairs",
)
SHORT_ROWS = ("dedup-cross-caller", "health-route", "connect-deadline")


def test_every_issue_22_row_is_an_attack() -> None:
    assert set(ISSUE_22_ROWS) <= set(ATTACKS)


def test_the_short_rows_run_and_say_what_the_server_did() -> None:
    argv = [sys.executable, "-m", "benchmarks.attacks", "--quick", "--attack", ",".join(SHORT_ROWS)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert "bob refused (403) both; alice's call with bob's id ran" in out
    assert "guest (denied the route) got: 404 no route at the address 'echo'" in out
    timings = re.search(r"raised after (\d+\.\d) s; leaving took (\d+\.\d) s", out)
    assert timings is not None, out
    raised, left = map(float, timings.groups())
    assert 2.0 <= raised < 3.0  # connect(timeout=2)
    assert 1.0 <= left < 2.0  # the client's close wait
