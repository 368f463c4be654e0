"""Memory stays bounded when a peer stops reading (issue 9 §2), against a server in a child
process whose RSS is read from ``/proc``.

The attacker pipelines a paired link and tens of thousands of 16 KiB echo requests (the
service grants that much credit at once) and never reads a byte of the replies. Without a
bound the server keeps reading, and every reply waits in its memory; with it, the server stops
reading from that peer once ``MAX_OUTGOING_BYTES`` wait for it, so the attacker's own sends
block, and the server still serves everybody else.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from pairlink import connect
from tests.service_peers import raw_client
from tests.test_client_cli import Served, restore_logging  # noqa: F401 - autouse fixture

BODY = "x" * (16 << 10)
REQUESTS = 16_384  # 256 MiB of requests, and as much of replies
BLOCKED_AFTER = 3.0
"""Seconds a batch of sends may take before we call the attacker blocked (the server stopped
reading it): generous, since a busy CI machine may simply be slow."""
MAX_GROWTH = 64 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
@pytest.mark.timeout(120)
async def test_a_client_that_never_reads_cannot_grow_server_memory() -> None:
    with Served("tests.hostile_services:BigBox", "--listen", "amqp://127.0.0.1:0") as served:
        url = served.url()
        pid = served.process.pid
        async with connect(url) as client:  # warm the server up: imports, first call paths
            bigbox = await client.service("bigbox")
            assert await bigbox.echo("warm") == "warm"
        before = rss(pid)
        async with raw_client(url) as attacker:
            sender, _receiver = attacker.pair("bigbox", reply_credit=1_000_000)
            sent = 0
            blocked = False
            while sent < REQUESTS:
                for _ in range(64):
                    attacker.request(sender, "echo", BODY)
                sent += 64
                with trio.move_on_after(BLOCKED_AFTER) as scope:
                    await attacker.flush()  # never a read: the replies pile up at the server
                if scope.cancelled_caught:
                    blocked = True
                    break
            growth = rss(pid) - before
            # the server still serves others while the attacker sits on its replies
            async with connect(url) as other:
                bigbox = await other.service("bigbox")
                with trio.fail_after(20):
                    assert await bigbox.echo("still served") == "still served"
            growth = max(growth, rss(pid) - before)
        assert blocked, f"the server read all {sent} requests of a peer that reads nothing"
        assert growth < MAX_GROWTH, f"server RSS grew {growth / 2**20:.0f} MiB"
