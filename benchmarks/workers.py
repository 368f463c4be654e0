"""Workers benchmark: ``pairlink serve --workers 1`` against ``--workers 2``, the same echo.

The server is the command a user runs, ``pairlink serve services.echo --workers N`` on
127.0.0.1 (port 0), started afresh for every round; its calls are the inline ``echo`` of 64
bytes (``@handler(inline=True)``, as in :mod:`benchmarks.rpc`). The load comes from
``--clients`` processes (2) of their own, each with ``--connections`` connections (4) and
``--inflight`` calls in flight (100) spread over them. ``SO_REUSEPORT`` hands each *connection*
to one worker (by a hash of its addresses), so the calls spread only as evenly as the
connections did: the round's line shows each worker's share of the server's CPU.

Each client warms up, says it is ready, and on the driver's word runs ``--duration`` seconds; the
driver reads the server's CPU time around that window (``/proc/PID/stat`` of each worker, or of
the single process) and each client gives its own (``getrusage``). The two settings alternate,
the order swapping every round; the figures are medians of the rounds, ending with
``workers scaling 2 vs 1``.

What limits the figure on a 2-core machine: the clients share the cores with the workers, and
a pairlink client spends more CPU per call than the server does (the ``µs/call`` figures). With
two workers, workers and clients together keep both cores busy (the ``cores`` figures of each
round), so the machine, mostly its clients, is the limit, not the workers: the server's CPU per
call stays the same with two workers. The last line puts a number on it: the most calls/s
these CPUs can give when every call costs the server and the clients what the two-worker rounds
measured (CPUs / (server + client CPU per call)), as a multiple of one worker's throughput; no
number of workers scales past it. With clients on other machines, or spare cores, two workers
approach twice the throughput of one as long as the connections spread evenly.

Run: ``python -m benchmarks.workers [--rounds N] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from benchmarks.rpc import (
    READY_TIMEOUT,
    ROOT,
    Child,
    ChildFailed,
    _child_setup,
    _terminate,
    alternate,
    children,
    median,
    run_main,
)
from benchmarks.rpc_stacks import PAYLOAD, Control

SETTINGS = ("1", "2")
"""The ``--workers`` compared."""
TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# The server: the pairlink command


@contextlib.contextmanager
def served(
    workers: int, module: str = "services.echo", env: dict[str, str] | None = None
) -> Iterator[tuple[int, list[int]]]:
    """``pairlink serve <module> --workers N`` (``env``: more environment variables), until
    the block ends (then SIGTERM): its port and the pids that serve (the workers', or the
    process's own)."""
    log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    argv = ["serve", module, "--listen", "amqp://127.0.0.1:0", "--workers", str(workers)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pairlink", *argv, "--log-level", "info"],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
        preexec_fn=functools.partial(_child_setup, None),
    )
    try:
        ready = "serve.listening" if workers > 1 else "server.listening"
        text = _wait_for_line(proc, log, ready)
        match = re.search(rf"{ready}.*url=amqp://127\.0\.0\.1:(\d+)", text)
        assert match is not None
        pids = [int(pid) for pid in re.findall(r"worker\.serving.*pid=(\d+)", text)]
        yield int(match.group(1)), pids or [proc.pid]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the workers have groups of their own
            proc.wait()
        log.close()


def _wait_for_line(proc: subprocess.Popen[bytes], log: IO[bytes], event: str) -> str:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        log.seek(0)
        text = log.read().decode(errors="replace")
        if event in text:
            return text
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ChildFailed(f"the server never said {event}; its stderr:\n{text[-3000:]}")
        time.sleep(0.05)


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


# ---------------------------------------------------------------------------------------------
# One round


def run_round(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """Serve with ``setting`` workers, load it from the client processes; the round's figures:
    ``throughput`` (calls/s), ``server_cores`` and ``client_cores`` (CPU seconds per second
    of the window), ``server_us`` and ``client_us`` (CPU per call) and ``shares`` (each
    worker's part of the server's CPU)."""
    plan = ["--connections", str(args.connections), "--inflight", str(args.inflight)]
    plan += ["--duration", str(args.duration), "--warmup", str(args.warmup)]
    with children() as procs:
        # the clients start (import) while the server does
        clients = [
            Child(f"client {i}", ["--child", *plan], module="benchmarks.workers")
            for i in range(args.clients)
        ]
        procs += clients
        with served(int(setting)) as (port, pids):
            for client in clients:
                client.send(port=port)
            for client in clients:
                client.receive(READY_TIMEOUT)  # connected and warmed up
            before = [cpu_of(pid) for pid in pids]
            for client in clients:
                client.send(go=True)
            reports = [client.receive(args.duration + READY_TIMEOUT) for client in clients]
            used = [cpu_of(pid) - start for pid, start in zip(pids, before, strict=True)]
    window = max(report["elapsed"] for report in reports)
    calls = sum(report["calls"] for report in reports)
    if calls <= 0:
        raise ChildFailed(f"no call completed with {setting} workers")
    client_cpu = sum(report["cpu"] for report in reports)
    return {
        "throughput": sum(report["calls"] / report["elapsed"] for report in reports),
        "server_cores": sum(used) / window,
        "client_cores": client_cpu / window,
        "server_us": sum(used) / calls * 1e6,
        "client_us": client_cpu / calls * 1e6,
        "shares": [u / sum(used) for u in used] if sum(used) else [],
    }


# ---------------------------------------------------------------------------------------------
# A client process


def client_main(args: argparse.Namespace) -> None:
    import trio

    from pairlink import connect

    ctl = Control()
    port = ctl.receive()["port"]

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            calls = []
            for _ in range(args.connections):
                client = await stack.enter_async_context(connect(f"amqp://127.0.0.1:{port}"))
                calls.append((await client.service("echo")).echo)

            async def pipelined(seconds: float) -> tuple[int, float]:
                done = 0
                start = time.perf_counter()
                deadline = start + seconds

                async def caller(index: int) -> None:
                    nonlocal done
                    call = calls[index % len(calls)]
                    while time.perf_counter() < deadline:
                        if await call(PAYLOAD) != PAYLOAD:
                            raise AssertionError("wrong echo")
                        done += 1

                async with trio.open_nursery() as nursery:
                    for index in range(args.inflight):
                        nursery.start_soon(caller, index)
                return done, time.perf_counter() - start

            await pipelined(args.warmup)
            ctl.send(ready=True)
            await trio.to_thread.run_sync(ctl.receive)  # go
            cpu = _cpu_seconds()
            done, elapsed = await pipelined(args.duration)
            ctl.send(calls=done, elapsed=elapsed, cpu=_cpu_seconds() - cpu)

    trio.run(main)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# Driver


def round_options(description: str, rounds: int) -> argparse.ArgumentParser:
    """A parser with the options of a benchmark in rounds of a set duration: ``--rounds``
    (``rounds``), ``--duration``, ``--warmup`` and ``--quick`` (see :func:`parsed`)."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=rounds, help=f"rounds of each setting ({rounds})"
    )
    parser.add_argument("--duration", type=float, default=3.0, help="measured window, s (3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="pipelined warm-up, s (0.5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 short round")
    return parser


def parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments; ``--quick`` makes them one round of 1 s after 0.2 s of warm-up."""
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.0, 0.2
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = round_options(__doc__, rounds=5)
    parser.add_argument("--clients", type=int, default=2, help="client processes (2)")
    parser.add_argument("--connections", type=int, default=4, help="connections each (4)")
    parser.add_argument("--inflight", type=int, default=100, help="calls in flight each (100)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parsed(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        client_main(args)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    print(
        f"echo of 64 bytes, inline handler; {args.clients} client processes x "
        f"{args.connections} connections, {args.inflight} calls in flight each, "
        f"{args.duration:g} s a round; {os.cpu_count()} CPUs shared by clients and workers"
    )

    def report(setting: str, figures: dict[str, Any]) -> str:
        shares = " + ".join(f"{share:.0%}" for share in figures["shares"])
        return (
            f"workers {setting}: {figures['throughput']:9,.0f} calls/s  server "
            f"{figures['server_cores']:.2f} cores ({shares}), clients "
            f"{figures['client_cores']:.2f} cores"
        )

    results, failures = alternate(SETTINGS, args.rounds, lambda s: run_round(s, args), report)
    print()
    for setting in SETTINGS:
        rounds = results[setting]
        print(
            f"workers {setting}: {median(rounds, 'throughput'):,.0f} calls/s (median of "
            f"{len(rounds)}; CPU: server {median(rounds, 'server_cores'):.2f} cores, "
            f"{median(rounds, 'server_us'):.0f} µs/call; clients "
            f"{median(rounds, 'client_cores'):.2f} cores, {median(rounds, 'client_us'):.0f} "
            "µs/call)"
        )
    one, two = median(results["1"], "throughput"), median(results["2"], "throughput")
    print(f"workers scaling 2 vs 1: {two / one:.2f}")
    cpus = len(os.sched_getaffinity(0))
    per_call = (median(results["2"], "server_us") + median(results["2"], "client_us")) / 1e6
    ceiling = cpus / per_call
    print(
        f"workers ceiling of {cpus} CPUs shared with the clients: {ceiling:,.0f} calls/s, "
        f"{ceiling / one:.2f} x workers 1"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
