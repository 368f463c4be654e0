"""Gateway benchmark: the echo workload through two gateways against the same calls direct.

Direct: client -> CO. Through gateways: client -> GN -> GO -> CO, the chain of issue 4 (LP-11)
with the gateways' default settings and plain ``amqp://`` on 127.0.0.1, anonymous SASL. Each of
CO (the echo server of :mod:`benchmarks.rpc`), GO, GN (``services.gateway.serve_gateway`` of a
config generated for the round) and the client is a process of its own, started afresh for
every round; the driver, phases and figures are :mod:`benchmarks.rpc`'s (100 calls in flight
for ``--duration`` seconds, then sequential calls for p50/p99; CPU per call of each process).
The two paths alternate, the order swapping every round; the table gives the medians, and the
last line is the ratio of the median throughputs, through gateways over direct; the line before
it, the most that ratio can be when the processes' CPU per call is all that limits them
(:func:`cpu_bound`): it falls as the client and service get cheaper, the gateways costing the
same.

``--profile`` adds one round through the gateways with GN and GO under cProfile during the
throughput window, and prints where each gateway's time per call goes (what a relay spends on a
message it forwards undecoded).

Run: ``python -m benchmarks.gateway [--rounds N] [--quick] [--profile]``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.rpc import (
    READY_TIMEOUT,
    Child,
    ChildFailed,
    _terminate,
    alternate,
    children,
    client_argv,
    drive,
    median,
    print_profile,
    run_main,
    server_argv,
)

PATHS = ("direct", "gateways")
GATEWAY_CONFIG = """\
listen = "amqp://127.0.0.1:0"
container_id = "{name}"
[[route]]
public = "echo"
upstream = "amqp://127.0.0.1:{upstream}"
address = "echo"
"""


def start_gateway(
    name: str, upstream: int, folder: Path, args: argparse.Namespace, profile_dir: str | None
) -> Child:
    """A gateway process routing ``echo`` to the port ``upstream``; it says ``{"ready": port}``
    once it listens, then reports its CPU time like the echo server does (``profile_dir``: and
    writes its profile there as ``NAME.prof``)."""
    config = folder / f"{name}.toml"
    config.write_text(GATEWAY_CONFIG.format(name=name, upstream=upstream))
    argv = ["--child", "gateway", "--config", str(config), "--log-level", args.log_level]
    if profile_dir is not None:
        argv += ["--profile-out", os.path.join(profile_dir, f"{name}.prof")]
    return Child(name, argv, module="benchmarks.gateway")


def run_round(
    path: str, args: argparse.Namespace, profile_dir: str | None = None
) -> dict[str, float]:
    with children() as procs, tempfile.TemporaryDirectory(prefix="pairlink-gw-bench-") as folder:
        co = Child("co", server_argv("pairlink", args))
        procs.append(co)
        client = Child(f"{path} client", client_argv("pairlink", args))
        procs.append(client)
        port = co.receive(READY_TIMEOUT)["ready"]
        servers = {"server": co}
        if path == "gateways":
            for name in ("go", "gn"):  # GO routes to CO; GN to GO; the client calls GN
                gateway = start_gateway(name, port, Path(folder), args, profile_dir)
                procs.append(gateway)
                port = gateway.receive(READY_TIMEOUT)["ready"]
                servers[name] = gateway
        return drive(client, port, servers, args, profile_dir=profile_dir)


# ---------------------------------------------------------------------------------------------
# The gateway process


def gateway_child(config: str, log_level: str, profile_out: str | None) -> None:
    import logging

    import structlog
    import trio

    from benchmarks.rpc_stacks import Control, ServerControl
    from services.gateway import serve_gateway

    level = logging.getLevelNamesMapping()[log_level.upper()]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    control = ServerControl(Control(), profile_out=profile_out)

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        control.in_serving_thread = lambda fn: trio.from_thread.run_sync(fn, trio_token=token)
        async with trio.open_nursery() as nursery:
            gateway = await nursery.start(serve_gateway, config)
            control.ready(gateway.port)  # it exits the process when the driver closes stdin

    trio.run(main)


# ---------------------------------------------------------------------------------------------
# Driver


COLUMNS = [
    ("throughput", "calls/s", "{:,.0f}"),
    ("p50", "p50 µs", "{:,.0f}"),
    ("p99", "p99 µs", "{:,.0f}"),
    ("throughput.client_us", "client", "{:.1f}"),
    ("throughput.gn_us", "GN", "{:.1f}"),
    ("throughput.go_us", "GO", "{:.1f}"),
    ("throughput.server_us", "CO", "{:.1f}"),
]


def cpu_bound(rounds: list[dict[str, float]], cores: int) -> float:
    """The calls/s a path's processes would reach if CPU were all that held them back, from
    their median CPU per call: each at most one core (none runs Python on more), all of them
    together at most ``cores``. Through gateways four processes share what two use direct, so
    the ratio of these bounds is the most the throughput ratio can be on this machine."""
    costs = [median(rounds, key) for key, _, _ in COLUMNS[3:]]
    costs = [cost for cost in costs if not math.isnan(cost)]  # (direct: no GN, GO)
    return min(cores / sum(costs), 1 / max(costs)) * 1e6


def print_table(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    print()
    print(
        f"echo of 64 bytes, {args.inflight} calls in flight for {args.duration:g} s, then "
        f"{args.latency_calls} sequential calls; medians of the rounds; client/GN/GO/CO: CPU "
        "µs per pipelined call"
    )
    head = f"{'path':<10}{'rounds':>6}" + "".join(f"{title:>10}" for _, title, _ in COLUMNS)
    print(head)
    print("-" * len(head))
    for path, rounds in results.items():
        values = [(median(rounds, key), fmt) for key, _, fmt in COLUMNS]
        cells = "".join(f"{'-' if math.isnan(v) else fmt.format(v):>10}" for v, fmt in values)
        print(f"{path:<10}{len(rounds):>6}{cells}")
    print()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each path (5)")
    parser.add_argument("--duration", type=float, default=2.0, help="throughput window, s (2)")
    parser.add_argument("--warmup", type=float, default=0.5, help="pipelined warm-up, s (0.5)")
    parser.add_argument("--inflight", type=int, default=100, help="calls in flight (100)")
    parser.add_argument(
        "--latency-calls", type=int, default=1000, help="sequential calls for p50/p99 (1000)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 short round")
    parser.add_argument(
        "--profile", action="store_true", help="one more round with the gateways under cProfile"
    )
    parser.add_argument("--profile-top", type=int, default=18, help="rows of the profile (18)")
    parser.add_argument(
        "--log-level", default="warning", help="structlog level of pairlink's processes"
    )
    parser.add_argument("--child", choices=("gateway",), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup, args.latency_calls = 1, 0.5, 0.2, 300
    args.profile_phase = "throughput"  # the window profiled, and benchmarks.rpc's client takes it
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        gateway_child(args.config, args.log_level, args.profile_out)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    started = time.monotonic()

    def report(path: str, figures: dict[str, float]) -> str:
        return (
            f"{path:<9} {figures['throughput']:9,.0f} calls/s"
            f"  p50 {figures['p50']:6,.0f} µs  p99 {figures['p99']:6,.0f} µs"
        )

    results, failures = alternate(PATHS, args.rounds, lambda path: run_round(path, args), report)
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="pairlink-gw-prof-") as folder:
            try:
                figures = run_round("gateways", args, profile_dir=folder)
            except ChildFailed as exc:
                failures += 1
                print(f"profiled round: FAILED: {exc}", file=sys.stderr)
            else:
                calls = int(figures["throughput.calls"])
                print("\nprofiled round through the gateways, throughput phase (cProfile inflates")
                print(
                    f"every Python call: GN {figures['throughput.gn_us']:.1f} µs CPU/call under it)"
                )
                for name in ("gn", "go"):
                    title = f"gateway {name.upper()}"
                    print_profile(
                        os.path.join(folder, f"{name}.prof"), calls, title, args.profile_top
                    )
    print_table(results, args)
    print(f"{time.monotonic() - started:.0f} s in all")
    direct, gateways = results["direct"], results["gateways"]
    if direct and gateways:
        cores = len(os.sched_getaffinity(0))
        allowed = cpu_bound(gateways, cores) / cpu_bound(direct, cores)
        print(f"gateway throughput ratio the CPU allows ({cores} cores): {allowed:.2f}")
        ratio = median(gateways, "throughput") / median(direct, "throughput")
        print(f"gateway throughput ratio vs direct: {ratio:.2f}")
    else:
        print("gateway throughput ratio vs direct: n/a")
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
