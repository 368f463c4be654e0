"""A replica whose handler's effect is seen from outside the process: ``pairlink serve
tests.spark.effects`` appends the id of every row it runs to ``<PAIRLINK_TEST_EFFECTS>/<pid>``,
a line per run, written through at once so that a replica killed with SIGKILL leaves every
effect it had in its file."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from pairlink import handler, service

EFFECTS_DIR = "PAIRLINK_TEST_EFFECTS"
"""The environment variable naming the folder of the replicas' effect files."""


@service("effects", max_concurrency=64, mailbox=1024, dedup_window=600, dedup_size=200_000)
class Effects:
    """``score(id, text)``: records the run, answers what ``tests.spark.recorder`` does."""

    def __init__(self) -> None:
        path = Path(os.environ[EFFECTS_DIR]) / str(os.getpid())
        self.file = path.open("a", buffering=1)  # open for the process's life

    @handler(inline=True)
    def score(self, id: int, text: str) -> dict[str, object]:
        self.file.write(f"{id}\n")
        return {"score": id / 2, "label": text.upper()}


def effects(folder: Path, pid: int) -> Counter[int]:
    """How many times the replica ``pid`` ran each row."""
    path = folder / str(pid)
    return Counter(int(line) for line in path.read_text().split()) if path.exists() else Counter()
