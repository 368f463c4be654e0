"""``make fuzz``: every fuzz target in turn, for a bounded time, and a verdict.

    python -m fuzz [--seconds N] [--timeout S] [TARGET ...]

``--seconds`` (default: ``$FUZZ_SECONDS``, else 600) is split evenly between the targets. Each
runs as its own process (``python -m fuzz.fuzzer TARGET``) on its corpus folder and its
committed seeds, with libFuzzer's per-input ``-timeout`` (default 1 s); its output goes to
``fuzz/logs/TARGET.log``. A target stops early at its first failure. The exit status is 1 when
any target failed, with the failing input's path (``fuzz/crashers/TARGET/...``) and the end of
its log printed; 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from fuzz import CORPUS, CRASHERS, DICTIONARY, HERE, TARGET_NAMES, seed_folder

DEFAULT_SECONDS = 600
"""The whole run's length when neither ``--seconds`` nor ``$FUZZ_SECONDS`` says otherwise."""
MAX_LEN = 4096
"""The longest input libFuzzer makes: twice the largest seed; a frame longer than that only
repeats what a short one reaches, and costs more per run."""
LOGS = HERE / "logs"
TAIL = 60
"""Lines of a failed target's log printed with the verdict (its traceback is at the end)."""


def run_target(target: str, seconds: int, timeout: int) -> tuple[int, list[Path], Path]:
    """Fuzz one target; returns (exit status, the inputs it saved as failures, its log)."""
    corpus = CORPUS / target
    crashers = CRASHERS / target
    for folder in (corpus, crashers, LOGS):
        folder.mkdir(parents=True, exist_ok=True)
    before = set(crashers.iterdir())
    log = LOGS / f"{target}.log"
    command = [
        sys.executable,
        "-m",
        "fuzz.fuzzer",
        target,
        f"-max_total_time={seconds}",
        f"-timeout={timeout}",
        f"-max_len={MAX_LEN}",
        f"-dict={DICTIONARY}",
        f"-artifact_prefix={crashers}/",
        "-print_final_stats=1",
        str(corpus),
        str(seed_folder(target)),
    ]
    with log.open("w") as out:
        status = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, cwd=HERE.parent)
    return status, sorted(set(crashers.iterdir()) - before), log


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds",
        type=int,
        default=int(os.environ.get("FUZZ_SECONDS") or DEFAULT_SECONDS),
        help="the whole run, split between the targets (default: $FUZZ_SECONDS or 600)",
    )
    parser.add_argument(
        "--timeout", type=int, default=1, help="seconds one input may take (default: 1)"
    )
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=", ".join(TARGET_NAMES))
    options = parser.parse_args()
    targets = options.targets or list(TARGET_NAMES)
    unknown = sorted(set(targets) - set(TARGET_NAMES))
    if unknown:
        parser.error(f"unknown targets {unknown}: choose from {', '.join(TARGET_NAMES)}")
    share = max(1, options.seconds // len(targets))
    failed = False
    for target in targets:
        started = time.monotonic()
        print(f"fuzz {target}: {share} s ...", flush=True)
        status, found, log = run_target(target, share, options.timeout)
        took = time.monotonic() - started
        stats = _final_stats(log)
        if status == 0 and not found:
            print(f"fuzz {target}: ok in {took:.0f} s ({stats}); log {log}", flush=True)
            continue
        failed = True
        print(f"fuzz {target}: FAILED (exit status {status}) after {took:.0f} s; log {log}")
        print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-TAIL:]))
        for path in found:
            print(f"fuzz {target}: failing input {path}")
            print(f"  reproduce: python -m fuzz.fuzzer {target} {path}")
    return 1 if failed else 0


def _final_stats(log: Path) -> str:
    """libFuzzer's closing counters (runs, executions per second, peak memory), in one line."""
    stats = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("stat::"):
            key, _, value = line[len("stat::") :].partition(":")
            stats[key.strip()] = value.strip()
    keys = ("number_of_executed_units", "average_exec_per_sec", "peak_rss_mb")
    return ", ".join(f"{k} {stats[k]}" for k in keys if k in stats) or "no stats"


if __name__ == "__main__":
    sys.exit(main())
