"""RPC benchmark: one echo workload on pairlink, python-qpid-proton and grpc.aio.

Each call sends a 64-byte payload and gets it back. Server and client of a stack run in two
processes of their own (:mod:`benchmarks.rpc_stacks`) on 127.0.0.1 (the servers bind port 0)
and are started afresh for every round:

- pairlink: ``pairlink.serve`` of ``services/echo.py``, ``pairlink.connect``
  calling ``echo.echo(payload)`` over one paired link;
- proton: a ``Container`` with a ``MessagingHandler`` on each side, direct (no broker): the client
  sends pre-settled requests to ``echo`` and receives the replies on a dynamic reply address;
  the server answers each request's ``reply-to``; both receivers keep 1000 credits (Proton's
  default of 10 starves a pipelined peer);
- grpc: ``grpc.aio`` with a generic unary-unary handler on raw bytes.

Handler kinds: the ``pairlink`` row's echo is an ``@handler(inline=True)`` plain ``def`` (run on
the event loop as soon as the request is read); the ``pairlink-async`` row calls the same echo
written as an ``async def`` (run in a worker task), and has ratio lines of its own. A second
section serves the same workload with each kind of
handler of ``services/echo.py`` (``--kinds``): ``inline`` (``echo``), ``thread`` (``echo_thread``,
a plain ``def``'s default: a thread of the service's pool) and ``async`` (``echo_async``), in
``--kind-rounds`` rounds of their own, and ends with what a thread and an ``async def`` cost
against the inline fast path.

Measured per round and stack, after a warm-up on the same connection: (a) throughput with
``--inflight`` calls (100) in flight for ``--duration`` seconds; (b) latency of
``--latency-calls`` sequential calls (p50, p99); (c) the server's CPU time per call over each
of those windows (``getrusage`` of the server process, all its threads, user + system; steadier
than wall time on a noisy machine), and the client's. The stacks run alternately, the order
rotating every round, and the table gives the median of the rounds. The last two lines are the
ratios of pairlink's median throughput to Proton's and to gRPC's.

``--profile`` adds one pairlink round with the server under cProfile during the throughput
window (``--profile-phase latency``: the sequential one), server and client pinned to CPUs 0 and
1 so that neither preempts the other inside a profiled ``send``, and prints where the server's
time per call goes, by module and by function (``--profile-client``: the client's too).
``--pin`` pins every round that way (steadier on an idle machine, worse on a busy one).

Run: ``python -m benchmarks.rpc [--rounds N] [--quick] [--profile] [--stacks pairlink,proton]``
(``--quick``: one short round, a smoke test).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import pstats
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("pairlink", "proton", "grpc")
HANDLERS = {"inline": "echo", "thread": "echo_thread", "async": "echo_async"}
"""The kinds of handler the pairlink client can call, and the echo service's operation of each."""
CONTESTANTS = {
    "pairlink": ("pairlink", "inline"),
    "pairlink-async": ("pairlink", "async"),
    "proton": ("proton", "inline"),
    "grpc": ("grpc", "inline"),
}
"""The rows of the main table: a stack, and for pairlink the kind of handler called (the echo a
user writes as ``async def`` has a row of its own, measured in the same rotation as the peers)."""
READY_TIMEOUT = 60.0
PHASE_SLACK = 60.0


R = TypeVar("R")


class ChildFailed(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Child processes


def _child_setup(cpu: int | None) -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the driver
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


class Child:
    """One benchmark process: JSON lines to its stdin, from its stdout; stderr kept in a file."""

    def __init__(
        self, name: str, argv: list[str], *, cpu: int | None = None, module: str = "benchmarks.rpc"
    ) -> None:
        self.name = name
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # a Ctrl-C reaches the driver only, which stops us
            preexec_fn=functools.partial(_child_setup, cpu),
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = b""

    def send(self, **message: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self.failed("exited") from None

    def receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self._fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise self.failed(f"said nothing for {timeout:.0f} s")
                try:
                    chunk = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    self.proc.wait()
                    raise self.failed(f"exited with status {self.proc.returncode}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def failed(self, what: str) -> ChildFailed:
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace")[-3000:]
        return ChildFailed(f"{self.name} {what}; its stderr ends with:\n{tail}")

    def stop(self) -> None:
        """Close its stdin (it exits on EOF), then kill it if it lingers; never leaves it behind."""
        proc = self.proc
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(3.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        self._stderr.close()


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop()


# ---------------------------------------------------------------------------------------------
# One round of one stack


def server_argv(stack: str, args: argparse.Namespace) -> list[str]:
    return ["--child", "server", "--stack", stack, "--log-level", args.log_level]


def client_argv(stack: str, args: argparse.Namespace, handler: str = "inline") -> list[str]:
    plan = ["--inflight", str(args.inflight), "--duration", str(args.duration)]
    plan += ["--warmup", str(args.warmup), "--latency-calls", str(args.latency_calls)]
    plan += ["--log-level", args.log_level, "--profile-phase", args.profile_phase]
    return ["--child", "client", "--stack", stack, "--handler", handler, *plan]


def run_stack(
    stack: str,
    args: argparse.Namespace,
    *,
    profile_dir: str | None = None,
    pin: bool = False,
    handler: str = "inline",
) -> dict[str, float]:
    """Server and client of ``stack`` in two fresh processes (``pin``: the server on CPU 0, the
    client on CPU 1), the pairlink client calling the echo of ``handler``'s kind; the figures
    of this round."""
    server_args, client_args = server_argv(stack, args), client_argv(stack, args, handler)
    if profile_dir is not None:
        server_args += ["--profile-out", os.path.join(profile_dir, "server.prof")]
        if args.profile_client:
            client_args += ["--profile-out", os.path.join(profile_dir, "client.prof")]
    with children() as procs:
        server = Child(f"{stack} server", server_args, cpu=0 if pin else None)
        procs.append(server)
        # the client starts (imports) while the server does
        client = Child(f"{stack} client", client_args, cpu=1 if pin else None)
        procs.append(client)
        port = server.receive(READY_TIMEOUT)["ready"]
        return drive(client, port, {"server": server}, args, profile_dir=profile_dir)


def drive(
    client: Child,
    port: int,
    servers: dict[str, Child],
    args: argparse.Namespace,
    *,
    profile_dir: str | None = None,
) -> dict[str, float]:
    """One round's phases: the client calls ``port``; each of ``servers`` (ready) tells its CPU
    time around each phase. Figures: ``throughput``, ``p50``, ``p99`` and, per phase, the CPU
    per call of each server (``{phase}.{name}_us``) and of the client."""
    phase_timeout = args.duration + args.warmup + args.latency_calls * 0.01 + PHASE_SLACK
    result: dict[str, float] = {}
    client.receive(READY_TIMEOUT)  # hello
    client.send(port=port)
    at_mark: dict[str, dict[str, Any]] = {}
    while True:
        message = client.receive(phase_timeout)
        if "mark" in message:
            profile = profile_dir is not None and message["mark"] == args.profile_phase
            for name, server in servers.items():
                server.send(snap=message["mark"], profile="on" if profile else None)
                at_mark[name] = server.receive(READY_TIMEOUT)
            client.send(go=True)
        elif "done" in message:
            phase = message["done"]
            profile = profile_dir is not None and phase == args.profile_phase
            snaps = {}
            for name, server in servers.items():
                server.send(snap=phase, profile="off" if profile else None)
                snaps[name] = server.receive(READY_TIMEOUT)
            client.send(ok=True)
            calls = message["calls"]
            if calls <= 0:
                raise ChildFailed(f"{client.name}: no call completed in the {phase} phase")
            result[f"{phase}.calls"] = calls
            for name, snap in snaps.items():
                cpu = snap["cpu"] - at_mark[name]["cpu"]
                result[f"{phase}.{name}_us"] = cpu / calls * 1e6
            result[f"{phase}.client_us"] = message["cpu"] / calls * 1e6
            if phase == "throughput":
                result["throughput"] = calls / message["elapsed"]
            else:
                result["p50"], result["p99"] = message["p50"], message["p99"]
        elif message.get("finished"):
            return result


# ---------------------------------------------------------------------------------------------
# Report

COLUMNS = [
    ("throughput", "calls/s", "{:,.0f}"),
    ("p50", "p50 µs", "{:,.0f}"),
    ("p99", "p99 µs", "{:,.0f}"),
    ("throughput.server_us", "srv µs/call", "{:.1f}"),
    ("latency.server_us", "srv µs/seq", "{:.1f}"),
    ("throughput.client_us", "cli µs/call", "{:.1f}"),
]
LEGEND = """\
calls/s: pipelined throughput (range: slowest and fastest round). p50/p99: sequential calls.
srv/cli µs/call: CPU time (user + system, all threads) of the server/client process per call
while pipelined; srv µs/seq: the server's per sequential call."""


def median(rounds: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rounds if key in r]
    return statistics.median(values) if values else float("nan")


def print_table(
    results: dict[str, list[dict[str, float]]],
    args: argparse.Namespace,
    elapsed: float,
    what: str = "stack",
) -> None:
    """The medians of each contestant's rounds, named in a first column headed ``what``."""
    print()
    print(
        f"echo of 64 bytes: {args.inflight} calls in flight for {args.duration:g} s, then "
        f"{args.latency_calls} sequential calls; medians of the rounds ({elapsed:.0f} s in all)"
    )
    widths = [max(len(title), 7) + 2 for _, title, _ in COLUMNS]
    head = f"{what:<15}{'rounds':>6}"
    head += "".join(f"{title:>{w}}" for (_, title, _), w in zip(COLUMNS, widths, strict=True))
    print(head + f"{'calls/s range':>16}")
    print("-" * (len(head) + 16))
    for stack, rounds in results.items():
        if not rounds:
            print(f"{stack:<15}{0:>6}  ({'failed every round' if args.rounds else 'not run'})")
            continue
        cells = "".join(
            f"{fmt.format(median(rounds, key)):>{w}}"
            for (key, _, fmt), w in zip(COLUMNS, widths, strict=True)
        )
        rates = [r["throughput"] for r in rounds]
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        print(f"{stack:<15}{len(rounds):>6}{cells}{spread:>16}")
    print(LEGEND)
    print()


def kind_line(results: dict[str, list[dict[str, float]]], kind: str) -> str:
    """What a kind of handler costs against the inline fast path, as ratios of medians."""
    ours, inline = results.get(kind), results.get("inline")
    if not ours or not inline:
        return f"handler {kind} vs inline: n/a"
    return (
        f"handler {kind} vs inline: throughput "
        f"{median(ours, 'throughput') / median(inline, 'throughput'):.2f}, server µs/call "
        f"{median(ours, 'throughput.server_us') / median(inline, 'throughput.server_us'):.2f}"
    )


def ratio_line(
    results: dict[str, list[dict[str, float]]], other: str, name: str = "pairlink"
) -> str:
    """``rpc throughput ratio vs OTHER``, for ``name``'s row (the async row says so)."""
    ours, theirs = results.get(name), results.get(other)
    label = f"rpc throughput ratio vs {other}"
    if name != "pairlink":
        label += f" ({name.removeprefix('pairlink-')} handler)"
    if not ours or not theirs:
        return f"{label}: n/a"
    return f"{label}: {median(ours, 'throughput') / median(theirs, 'throughput'):.2f}"


IDLE = ("<method 'poll' of 'select.epoll' objects>", "<built-in method select.select>")
"""Where an event loop waits for the network: not time spent on a call."""


def _where(filename: str) -> str:
    """Group a profiled function by module: ours by path, libraries by package path."""
    if filename.startswith(("~", "<")):
        return "builtins (C functions called from Python)"
    parts = Path(filename).parts
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1 :])
    with contextlib.suppress(ValueError):
        return str(Path(filename).resolve().relative_to(ROOT))
    if "lib" in parts:
        return "stdlib " + "/".join(parts[parts.index("lib") + 2 :])
    return filename


def print_profile(path: str, calls: int, title: str, top: int) -> None:
    stats: dict[Any, Any] = pstats.Stats(path).stats  # type: ignore[attr-defined]
    by_module: dict[str, float] = defaultdict(float)
    rows = []
    idle = 0.0
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.items():
        if name in IDLE:
            idle += tottime
            continue
        where = _where(filename)
        by_module[where] += tottime
        label = name if filename.startswith("~") else f"{where}:{line}({name})"
        rows.append((tottime, cumtime, ncalls, label))
    busy = sum(by_module.values())
    print(
        f"\n{title}: {calls:,} calls; {busy / calls * 1e6:.1f} µs/call busy under cProfile "
        f"(+{idle / calls * 1e6:.1f} µs/call waiting in epoll/select, left out below)"
    )
    print("  own time by module (µs/call, share of busy):")
    for where, tottime in sorted(by_module.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {tottime / calls * 1e6:8.2f}  {tottime / busy:6.1%}  {where}")
    print("  top functions by own time (µs/call own, cumulative; times per call):")
    for tottime, cumtime, ncalls, label in sorted(rows, reverse=True)[:top]:
        print(
            f"    {tottime / calls * 1e6:8.2f} {cumtime / calls * 1e6:9.2f}"
            f"  {ncalls / calls:6.2f}  {label}"
        )


# ---------------------------------------------------------------------------------------------
# Driver


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every stack (7)")
    parser.add_argument("--duration", type=float, default=1.5, help="throughput window, s (1.5)")
    parser.add_argument("--warmup", type=float, default=0.3, help="pipelined warm-up, s (0.3)")
    parser.add_argument("--inflight", type=int, default=100, help="calls in flight (100)")
    parser.add_argument(
        "--latency-calls", type=int, default=1500, help="sequential calls for p50/p99 (1500)"
    )
    parser.add_argument(
        "--stacks", default=",".join(CONTESTANTS), help="comma-separated subset of the rows"
    )
    parser.add_argument(
        "--kinds",
        default=",".join(HANDLERS),
        help="pairlink handler kinds compared in a section of their own (comma-separated, "
        "'' for none; default: all)",
    )
    parser.add_argument(
        "--kind-rounds", type=int, default=3, help="rounds of each handler kind (3)"
    )
    parser.add_argument(
        "--pin", action="store_true", help="server on CPU 0, client on CPU 1 (default: unpinned)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 short round")
    parser.add_argument(
        "--profile", action="store_true", help="one more pairlink round, server under cProfile"
    )
    parser.add_argument(
        "--profile-client", action="store_true", help="with --profile: the client too"
    )
    parser.add_argument(
        "--profile-phase",
        choices=("throughput", "latency"),
        default="throughput",
        help="the window profiled: pipelined calls (default) or sequential ones",
    )
    parser.add_argument(
        "--profile-kind",
        choices=HANDLERS,
        default="inline",
        help="with --profile: the kind of handler the profiled round calls (inline)",
    )
    parser.add_argument("--profile-top", type=int, default=18, help="rows of the profile (18)")
    parser.add_argument(
        "--log-level", default="warning", help="structlog level of pairlink's processes"
    )
    # Child processes (benchmarks.rpc_stacks).
    parser.add_argument("--child", choices=("server", "client"), help=argparse.SUPPRESS)
    parser.add_argument("--stack", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--handler", choices=HANDLERS, default="inline", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup, args.latency_calls = 1, 0.5, 0.2, 300
        args.kind_rounds = 1
    args.stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    unknown = set(args.stacks) - set(CONTESTANTS)
    if unknown:
        parser.error(f"unknown stacks: {', '.join(sorted(unknown))}")
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = set(args.kinds) - set(HANDLERS)
    if unknown:
        parser.error(f"unknown handler kinds: {', '.join(sorted(unknown))}")
    if args.profile_client:
        args.profile = True
    if args.pin and not {0, 1} <= os.sched_getaffinity(0):
        parser.error("--pin needs CPUs 0 and 1")
    return args


def child_main(args: argparse.Namespace) -> None:
    if args.stack == "pairlink":
        import logging

        import structlog

        level = logging.getLevelNamesMapping()[args.log_level.upper()]
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    from benchmarks.rpc_stacks import Plan, run_child

    plan = None
    if args.child == "client":
        plan = Plan(
            args.inflight,
            args.duration,
            args.warmup,
            args.latency_calls,
            args.profile_out,
            args.profile_phase,
            HANDLERS[args.handler],
        )
    run_child(args.child, args.stack, plan, args.profile_out)


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the children


def alternate(
    names: Sequence[str],
    rounds: int,
    measure: Callable[[str], R],
    report: Callable[[str, R], str],
) -> tuple[dict[str, list[R]], int]:
    """``rounds`` rounds of ``measure`` for every name, the order rotated each round so no
    contestant always runs first (on a cold or a warm machine); prints ``report``'s line for
    each. A round whose child failed is counted and said, not fatal. Returns the results by
    name and the number of failed rounds."""
    results: dict[str, list[R]] = {name: [] for name in names}
    failures = 0
    for index in range(rounds):
        shift = index % len(names)
        for name in [*names[shift:], *names[:shift]]:
            try:
                result = measure(name)
            except ChildFailed as exc:
                failures += 1
                print(f"round {index + 1} {name}: FAILED: {exc}", file=sys.stderr)
                continue
            results[name].append(result)
            print(f"round {index + 1}/{rounds} {report(name, result)}", flush=True)
    return results, failures


def run_main(main: Callable[[], int]) -> NoReturn:
    """A benchmark's ``__main__``: exit with ``main()``'s code; Ctrl-C (its children stopped
    on the way out) is 130, without a traceback."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    started = time.monotonic()

    def report(stack: str, figures: dict[str, float]) -> str:
        return (
            f"{stack:<15} {figures['throughput']:9,.0f} calls/s"
            f"  p50 {figures['p50']:6,.0f} µs  p99 {figures['p99']:6,.0f} µs"
            f"  server {figures['throughput.server_us']:6.1f} µs/call"
            f" ({figures['latency.server_us']:.1f} sequential)"
        )

    def measure(name: str) -> dict[str, float]:
        stack, handler = CONTESTANTS[name]
        return run_stack(stack, args, pin=args.pin, handler=handler)

    results, failures = alternate(args.stacks, args.rounds if args.stacks else 0, measure, report)
    if args.profile:
        # Pinned apart, neither side preempts the other on a wake-up: cProfile's wall clock
        # would otherwise charge the peer's run to the socket send that woke it.
        can_pin = {0, 1} <= os.sched_getaffinity(0)
        with tempfile.TemporaryDirectory(prefix="pairlink-rpc-prof-") as folder:
            try:
                figures = run_stack(
                    "pairlink", args, profile_dir=folder, pin=can_pin, handler=args.profile_kind
                )
            except ChildFailed as exc:
                failures += 1
                print(f"profiled pairlink round: FAILED: {exc}", file=sys.stderr)
            else:
                phase = args.profile_phase
                calls = int(figures[f"{phase}.calls"])
                print(
                    f"\nprofiled pairlink round ({args.profile_kind} handler), {phase} phase"
                    f"{' (server on CPU 0, client on CPU 1)' if can_pin else ''}; cProfile "
                    f"inflates every Python call: server {figures[f'{phase}.server_us']:.1f} µs "
                    f"CPU/call under it"
                )
                print_profile(
                    os.path.join(folder, "server.prof"), calls, "pairlink server", args.profile_top
                )
                if args.profile_client:
                    print_profile(
                        os.path.join(folder, "client.prof"),
                        calls,
                        "pairlink client",
                        args.profile_top,
                    )
    if args.stacks:
        print_table(results, args, time.monotonic() - started)
    for ours in ("pairlink", "pairlink-async"):
        for other in ("proton", "grpc"):
            if ours in results:
                print(ratio_line(results, other, ours))
    if args.kinds:
        started = time.monotonic()
        print(f"\npairlink handler kinds ({', '.join(f'{k}: {HANDLERS[k]}' for k in args.kinds)})")
        kinds, failed = alternate(
            args.kinds,
            args.kind_rounds,
            lambda kind: run_stack("pairlink", args, pin=args.pin, handler=kind),
            report,
        )
        failures += failed
        print_table(kinds, args, time.monotonic() - started, what="handler")
        for kind in args.kinds:
            if kind != "inline":
                print(kind_line(kinds, kind))
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
