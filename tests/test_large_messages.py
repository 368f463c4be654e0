"""A 60 MiB result costs its caller about twice its size, and a 60 MiB argument its service the
same (issue 22): the message's bytes as they arrive, and the value read from them; the body is
read in place, never copied in between (before, the client held a reply three times over).
Once sent, a large value leaves nothing behind (before, a thread's msgpack packer kept twice
its size for good).

Each side is measured alone, the other in a child process: this process with tracemalloc, a
server child by its peak RSS (``VmHWM``, reset through ``/proc/<pid>/clear_refs`` before the
call).
"""

from __future__ import annotations

import os
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from pairlink import connect, handler, open_server, service
from tests.test_backpressure import rss
from tests.test_client_cli import Served

SIZE = 60 * 2**20
"""Below the 64 MiB ``max_message_size`` both ends take by default, with room for the rest."""
MAX_RATIO = 2.5
"""Bound on the extra memory a large message costs, in its size: the received message and the
value read from it make 2 (plus up to 1/8 that the growing buffer of the arriving frames may
have over its content); one more copy makes 3."""
KEPT = SIZE // 8
"""What sending a large value may leave behind: none of it (allocator slack in RSS aside)."""


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


SENDER = """
    import sys
    import tracemalloc
    from pairlink._client import blocking
    size = int(sys.argv[2])
    data = bytes(size)
    with blocking.connect(sys.argv[1], timeout=60) as client:
        assert client.call("big", "length", b"warm") == 4
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        assert client.call("big", "length", data) == size
        print(tracemalloc.get_traced_memory()[0] - before)
"""


@pytest.mark.timeout(120)
async def test_a_client_keeps_nothing_of_a_60_mib_argument_it_sent() -> None:
    """In a process of its own: a thread's packer outlives the tests that used it."""
    async with open_server(Big(), listen="amqp://127.0.0.1:0") as server:
        sender = [sys.executable, "-c", textwrap.dedent(SENDER), server.url, str(SIZE)]
        done = await trio.run_process(sender, capture_stdout=True)
    kept = int(done.stdout)
    assert kept < KEPT, f"{kept / 2**20:.0f} MiB kept"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
@pytest.mark.timeout(120)
async def test_a_service_keeps_nothing_of_a_60_mib_result_it_sent() -> None:
    with served() as server:
        pid = server.process.pid
        async with connect(server.url()) as client:
            big = await client.service("big")
            assert await big.blob(10) == bytes(10)
            before = rss(pid)
            assert len(await big.blob(SIZE)) == SIZE
            kept = rss(pid) - before  # the connection still open: its writer holds nothing
    assert kept < KEPT, f"{kept / 2**20:.0f} MiB kept"
