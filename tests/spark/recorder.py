"""The service the Spark tests call: it records what ran, so tests can assert on effects."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio

from pairlink import handler, service
from pairlink._server.serving import Server


@service("recorder", max_concurrency=64, mailbox=1024, dedup_window=600)
class Recorder:
    """``score``: a result from the row, counted per id (the side effect dedup must not
    repeat), failing for the text ``boom``. ``slow``: holds each call 2 ms and records how many
    calls of each partition were running at once. ``shaped``: the reply ``SHAPES[id]``."""

    def __init__(self) -> None:
        self.runs: Counter[int] = Counter()
        self.active: Counter[int] = Counter()
        self.peaks: Counter[int] = Counter()

    @handler(expose_errors=ValueError)  # the "boom" the tests expect to see, type and message
    def score(self, id: int, text: str) -> dict[str, object]:
        self.runs[id] += 1
        if text == "boom":
            raise ValueError(f"boom at {id}")
        return {"score": id / 2, "label": text.upper()}

    @handler
    async def slow(self, part: int, id: int) -> int:
        self.active[part] += 1
        self.peaks[part] = max(self.peaks[part], self.active[part])
        await trio.sleep(0.002)
        self.active[part] -= 1
        return id * 2

    @handler
    def shaped(self, id: int) -> Any:
        return SHAPES[id]


SHAPES: list[Any] = [
    {"n": 2.0, "x": 3, "flag": True, "s": "a"},  # fits: an integral float, an int as a double
    {"n": 0.8944, "x": 1.5, "flag": False, "s": "b"},  # would truncate
    {"x": 1.5, "flag": False, "s": "c"},  # a field missing
    {"n": "12", "x": 1.5, "flag": False, "s": "d"},  # a string for an int
    {"n": True, "x": 1.5, "flag": False, "s": "e"},  # a bool for an int
    {"n": 1, "x": 1.5, "flag": 1, "s": "f"},  # an int for a bool
    [7, None, None, "g"],  # by position, nulls where the service says so
]
"""The replies of ``shaped``, for the result schema ``n int, x double, flag boolean, s string``."""


def expected(id: int) -> tuple[float, str]:
    """What ``score`` answers for row ``id`` with the text ``row <id>``."""
    return id / 2, f"ROW {id}"


def die_once_at(marker: Path, at: int, row: int) -> int:
    """An RDD map that kills its Python worker at row ``at``, the first time only (``marker``
    remembers): a task that dies mid-partition, as an executor lost under load does. It waits
    a second first, so the calls of the rows before are made and answered."""
    if row == at and not marker.exists():
        marker.touch()
        time.sleep(1.0)
        os._exit(1)
    return row


@attrs.frozen
class Served:
    """A ``Recorder`` and the server it runs in."""

    service: Recorder
    server: Server

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def dedup_hits(self) -> int:
        """Calls answered from the dedup store (or by waiting for their first copy)."""
        dedup = self.server.actors["recorder"].dedup
        assert dedup is not None
        return dedup.hits
