"""Replicas benchmark: how one client spreads its calls over a service's replicas, and what
balancing costs.

The replicas are the command a user runs, ``pairlink serve`` on 127.0.0.1 (port 0), one
process each, started afresh for every round; the client is this process, pipelining
``--inflight`` calls for ``--duration`` seconds after a warm-up. Three settings:

- ``equal``: three replicas of :mod:`benchmarks.paced` (each call waits 20 ms, and answers the
  replica's pid), the client connected to the three URLs: calls per replica, and the largest
  deviation from an even third (issue 23: within 10%);
- ``slow``: the same with the third replica four times slower (``PAIRLINK_BENCH_SLOWDOWN=4``):
  its calls against a fast one's (issue 23: about a quarter), the p50/p99 of each replica's
  calls, and the fast replicas' p99 against theirs in the ``equal`` rounds (it should stay the
  same: a slow replica gets fewer calls, not a longer line);
- ``list`` against ``direct``: one replica of ``services.echo`` (the inline echo of 64 bytes,
  as in :mod:`benchmarks.rpc`), the client connected with a list of its one URL (the
  replicas' machinery: placement, health checks) or with the plain URL: calls per CPU-second
  of client and server together (``getrusage`` of this process, ``/proc`` of the server),
  as a ratio (issue 23: within 5%).

The settings of each pair alternate, the order swapping every round; figures are medians of
the rounds.

Run: ``python -m benchmarks.replicas [--rounds N] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from benchmarks.paced import BASE_SECONDS, SLOWDOWN
from benchmarks.rpc import _terminate, alternate, median, run_main
from benchmarks.rpc_stacks import PAYLOAD
from benchmarks.workers import cpu_of, parsed, round_options, served
from pairlink import connect

SPREAD = ("equal", "slow")
"""The settings of the placement section."""
OVERHEAD = ("list", "direct")
"""The settings of the overhead section: ``connect([url])`` against ``connect(url)``."""
SLOWER = 4
"""How many times slower the third replica of ``slow`` is."""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def pipelined(
    call: Callable[[], Awaitable[Any]], inflight: int, seconds: float
) -> list[tuple[Any, float]]:
    """``inflight`` callers calling ``call`` for ``seconds``: each answer and its latency (s)."""
    done: list[tuple[Any, float]] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while (start := time.perf_counter()) < deadline:
            answer = await call()
            done.append((answer, time.perf_counter() - start))

    async with trio.open_nursery() as nursery:
        for _ in range(inflight):
            nursery.start_soon(caller)
    return done


def _quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if values else 0.0


# ---------------------------------------------------------------------------------------------
# Placement: three replicas, equal or one slow


def run_spread(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """Three replicas (the third ``SLOWER`` times slower in ``slow``) under one client: the
    round's ``calls`` per replica, their ``p50`` and ``p99`` (ms) and the ``throughput``."""
    with contextlib.ExitStack() as stack:
        pids, urls = [], []
        for index in range(3):
            slow = setting == "slow" and index == 2
            env = {SLOWDOWN: str(SLOWER)} if slow else {}
            port, (pid,) = stack.enter_context(served(1, "benchmarks.paced", env))
            pids.append(pid)
            urls.append(f"amqp://127.0.0.1:{port}")

        async def main() -> list[tuple[Any, float]]:
            async with connect(urls, timeout=30) as client:
                paced = await client.service("paced")
                await pipelined(paced.work, args.inflight, args.warmup)
                return await pipelined(paced.work, args.inflight, args.duration)

        done = trio.run(main)
    latencies: dict[int, list[float]] = defaultdict(list)
    for pid, latency in done:
        latencies[pid].append(latency * 1e3)
    return {
        "calls": [len(latencies[pid]) for pid in pids],
        "p50": [_quantile(latencies[pid], 50) for pid in pids],
        "p99": [_quantile(latencies[pid], 99) for pid in pids],
        "throughput": len(done) / args.duration,
    }


def deviation(calls: Sequence[int]) -> float:
    """The largest distance of a replica's calls from an even share, as a part of that share."""
    even = sum(calls) / len(calls)
    return max(abs(count - even) for count in calls) / even


def report_spread(setting: str, figures: dict[str, Any]) -> str:
    replicas = "  ".join(
        f"#{index + 1} {calls:6,} (p50 {p50:5.1f} p99 {p99:5.1f} ms)"
        for index, (calls, p50, p99) in enumerate(
            zip(figures["calls"], figures["p50"], figures["p99"], strict=True)
        )
    )
    return f"{setting:<6} {figures['throughput']:7,.0f} calls/s  {replicas}"


def summarize_spread(results: dict[str, list[dict[str, Any]]]) -> None:
    equal, slow = results["equal"], results["slow"]
    if not (equal and slow):
        return
    per = {
        name: [statistics.median(r["calls"][i] for r in rounds) for i in range(3)]
        for name, rounds in results.items()
    }
    print(
        f"replicas equal: calls per replica {' / '.join(f'{c:,.0f}' for c in per['equal'])}, "
        f"max deviation from even {statistics.median(deviation(r['calls']) for r in equal):.1%} "
        f"(median of {len(equal)} rounds; issue 23: within 10%)"
    )
    fast = [(r["calls"][0] + r["calls"][1]) / 2 for r in slow]
    share = statistics.median(r["calls"][2] / f for r, f in zip(slow, fast, strict=True))
    print(
        f"replicas one {SLOWER}x slower: calls per replica "
        f"{' / '.join(f'{c:,.0f}' for c in per['slow'])}; the slow one's calls vs a fast "
        f"one's: {share:.2f} (issue 23: about {1 / SLOWER:.2f})"
    )
    for name, rounds in results.items():
        cells = "  ".join(
            f"#{i + 1} p50 {statistics.median(r['p50'][i] for r in rounds):5.1f} "
            f"p99 {statistics.median(r['p99'][i] for r in rounds):5.1f} ms"
            for i in range(3)
        )
        print(f"replicas {name:<5} latency: {cells}")
    fast_p99 = {
        name: statistics.median(max(r["p99"][0], r["p99"][1]) for r in rounds)
        for name, rounds in results.items()
    }
    print(
        f"replicas fast ones' p99 with a slow one vs all equal: "
        f"{fast_p99['slow']:.1f} vs {fast_p99['equal']:.1f} ms, "
        f"ratio {fast_p99['slow'] / fast_p99['equal']:.2f}"
    )


# ---------------------------------------------------------------------------------------------
# Overhead: one replica, as a list or as a URL


def run_overhead(setting: str, args: argparse.Namespace) -> dict[str, float]:
    """One ``services.echo``, the client connected as ``setting`` says: ``throughput`` and
    ``per_cpu`` (calls per CPU-second of client and server)."""
    with served(1) as (port, (pid,)):
        url = f"amqp://127.0.0.1:{port}"

        async def main() -> dict[str, float]:
            async with connect([url] if setting == "list" else url, timeout=30) as client:
                echo = (await client.service("echo")).echo
                await pipelined(lambda: echo(PAYLOAD), args.echo_inflight, args.warmup)
                server, mine = cpu_of(pid), _cpu_seconds()
                done = await pipelined(lambda: echo(PAYLOAD), args.echo_inflight, args.duration)
                cpu = cpu_of(pid) - server + _cpu_seconds() - mine
            if any(answer != PAYLOAD for answer, _ in done):
                raise AssertionError("wrong echo")
            return {"throughput": len(done) / args.duration, "per_cpu": len(done) / cpu}

        return trio.run(main)


def report_overhead(setting: str, figures: dict[str, float]) -> str:
    return (
        f"{setting:<6} {figures['throughput']:7,.0f} calls/s  "
        f"{figures['per_cpu']:7,.0f} calls per CPU-second (client + server)"
    )


# ---------------------------------------------------------------------------------------------
# Driver


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = round_options(__doc__, rounds=3)
    parser.add_argument(
        "--inflight", type=int, default=48, help="paced calls in flight over three replicas (48)"
    )
    parser.add_argument(
        "--echo-inflight", type=int, default=100, help="echo calls in flight, overhead (100)"
    )
    return parsed(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    print(
        f"three pairlink serve of benchmarks.paced ({BASE_SECONDS * 1e3:g} ms a call), "
        f"{args.inflight} calls in "
        f"flight from one client, {args.duration:g} s a round; {os.cpu_count()} CPUs"
    )
    spread, failed = alternate(SPREAD, args.rounds, lambda s: run_spread(s, args), report_spread)
    print(
        f"\none pairlink serve of services.echo (inline, 64 bytes), {args.echo_inflight} calls "
        "in flight: connect([url]) (list) against connect(url) (direct)"
    )
    overhead, failed_too = alternate(
        OVERHEAD, args.rounds, lambda s: run_overhead(s, args), report_overhead
    )
    print()
    summarize_spread(spread)
    if overhead["list"] and overhead["direct"]:
        listed, direct = median(overhead["list"], "per_cpu"), median(overhead["direct"], "per_cpu")
        print(
            f"replicas overhead: {listed:,.0f} calls per CPU-second balancing over one replica "
            f"(a list) vs {direct:,.0f} direct, ratio {listed / direct:.3f} "
            "(issue 23: within 5%)"
        )
    missing = not all([*spread.values(), *overhead.values()])
    return 1 if failed or failed_too or missing else 0


if __name__ == "__main__":
    run_main(main)
