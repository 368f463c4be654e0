"""A 60 MiB result costs its caller about twice its size, and a 60 MiB argument its service the
same (issue 22): the message's bytes as they arrive, and the value read from them; the body is
read in place, never copied in between (before, the client held a reply three times over).

Each side is measured alone: the client with tracemalloc against a server in a child process
(so the server's own copies are not counted), the server by its peak RSS (``VmHWM``, reset
through ``/proc/<pid>/clear_refs`` before the call) against this process as the client.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from pairlink import connect, handler, service
from tests.test_backpressure import rss
from tests.test_client_cli import Served

SIZE = 60 * 2**20
"""Below the 64 MiB ``max_message_size`` both ends take by default, with room for the rest."""
MAX_RATIO = 2.5
"""Bound on the extra memory a large message costs, in its size: the received message and the
value read from it make 2 (plus up to 1/8 that the growing buffer of the arriving frames may
have over its content); one more copy makes 3."""


@service("big")
class Big:
    """Served in a child process: a large result, and a large argument's length."""

    @handler(inline=True)
    def blob(self, size: int) -> bytes:
        return bytes(size)

    @handler(inline=True)
    def length(self, data: bytes) -> int:
        return len(data)


def served() -> Served:
    return Served("tests.test_large_messages:Big", "--listen", "amqp://127.0.0.1:0")


@pytest.mark.timeout(120)
async def test_a_60_mib_result_costs_the_client_about_twice_its_size(
    fast_reads: Callable[[str], list[bool]],
) -> None:
    with served() as server:
        async with connect(server.url()) as client:
            big = await client.service("big")
            assert await big.blob(10) == bytes(10)  # warm: imports, the pair verified
            taken = fast_reads("reply")
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                value = await big.blob(SIZE)
                peak = tracemalloc.get_traced_memory()[1] - before
            finally:
                tracemalloc.stop()
    assert taken == [True]  # the usual reply's reading, not the whole message's
    assert value == bytes(SIZE)
    assert peak < MAX_RATIO * SIZE, f"{peak / SIZE:.2f} times the result's size"


def peak_rss(pid: int) -> int:
    """``VmHWM``: the most the process held since it started or since ``reset_peak_rss``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: the peak RSS starts again from now


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc")
@pytest.mark.timeout(120)
async def test_a_60_mib_argument_costs_the_service_about_twice_its_size() -> None:
    data = bytes(SIZE)
    with served() as server:
        pid = server.process.pid
        async with connect(server.url()) as client:
            big = await client.service("big")
            assert await big.length(b"warm") == 4
            reset_peak_rss(pid)
            before = rss(pid)
            assert await big.length(data) == SIZE
            peak = peak_rss(pid) - before
    assert peak < MAX_RATIO * SIZE, f"{peak / SIZE:.2f} times the argument's size"
