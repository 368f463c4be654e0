"""The service ``benchmarks.replicas`` balances calls over: each call takes a set time.

``pairlink serve benchmarks.paced`` serves ``paced.work()``, which waits ``BASE_SECONDS``
times the factor in the environment variable ``PAIRLINK_BENCH_SLOWDOWN`` (default 1) and
answers the process id, so the caller knows which replica served it. A wait, not a spin: a
replica four times slower holds each call four times as long without taking CPU from the
others on a 2-core machine, as a replica on a slower or busier host of its own would.
"""

from __future__ import annotations

import os

import trio

from pairlink import handler, service

SLOWDOWN = "PAIRLINK_BENCH_SLOWDOWN"
"""The environment variable that makes a replica that many times slower."""
BASE_SECONDS = 0.02
"""A call's time on a replica at full speed: long beside the ~50 µs of CPU a call costs on
this machine and the wait for a CPU under load (~2 ms at 5 ms a call), so the replicas'
speeds, not the CPUs, decide how fast calls come back."""


@service("paced", max_concurrency=256, mailbox=256)
class Paced:
    """Room for every call a benchmark has in flight: the replica's pace is its only limit."""

    def __init__(self) -> None:
        self.seconds = BASE_SECONDS * float(os.environ.get(SLOWDOWN, "1"))
        self.pid = os.getpid()

    @handler
    async def work(self) -> int:
        await trio.sleep(self.seconds)
        return self.pid
