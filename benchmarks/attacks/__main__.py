"""The driver: each attack against a fresh server, its server's RSS watched; the table."""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
import traceback
from collections import Counter

import attrs
import trio

import benchmarks.attacks
from benchmarks.attacks.attacks import ATTACKS, QUICK, RSS_LIMIT, Ctx, Plan
from benchmarks.attacks.children import (
    PROBE_TIMEOUT,
    START_TIMEOUT,
    Probe,
    child,
    log_to_stderr,
    normal_client,
    probe_main,
    rss_mib,
    serve_users,
)
from benchmarks.attacks.phases import PhaseTimeout, phase, tally
from benchmarks.rpc import ChildFailed, run_main
from pairlink._io.taskgroups import lone_errors_unwrapped

RSS_PERIOD = 0.02
"""Seconds between two RSS samples of the server."""


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.01 else f"{seconds * 1e3:,.0f} ms"


@attrs.define
class Row:
    attack: str
    rss_before: float | None = None
    rss_max: float | None = None
    verdict: str = "not run"
    normal: list[Probe] = attrs.field(factory=list)
    details: list[str] = attrs.field(factory=list)
    log: Counter[str] = attrs.field(factory=Counter)
    failed: bool = False
    started: float = 0.0  # wall-clock time the attack began


@attrs.define(eq=False)
class RssWatch:
    """The server's peak RSS while it runs; past ``limit``, the attack stops pushing."""

    pid: int
    limit: float
    ctx: Ctx
    peak: float = 0.0

    async def run(self) -> None:
        while (rss := rss_mib(self.pid)) is not None:
            self.peak = max(self.peak, rss)
            if rss > self.limit and not self.ctx.over_limit:
                self.ctx.stop_pushing()
            await trio.sleep(RSS_PERIOD)


async def run_attack(name: str, plan: Plan, code: str | None = None) -> Row:
    attack, row = ATTACKS[name], Row(name)
    print(f"{name}: running", file=sys.stderr, flush=True)
    try:
        with phase(f"{name} (all of it)", attack.budget(plan)), lone_errors_unwrapped():
            async with child(
                f"{name} server", *attack.server, nofile=plan.server_nofile, code=code
            ) as server:
                await server.wait_for(lambda: server.url is not None, START_TIMEOUT, "listening")
                assert server.url is not None
                ctx = Ctx(server.url, plan, server=server)
                async with normal_client(attack.probe, server.url) as prober:
                    ctx.prober = prober
                    row.rss_before = rss_mib(server.proc.pid)
                    watch = RssWatch(server.proc.pid, plan.rss_limit, ctx)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(watch.run)
                        row.started = time.time()
                        row.verdict = await attack.run(ctx)
                        nursery.cancel_scope.cancel()
                    if ctx.over_limit:
                        row.verdict += f" (stopped: server RSS > {plan.rss_limit:g} MiB)"
                    await ctx.probed()
                    row.rss_max = max(watch.peak, row.rss_before or 0.0)
                    probes = prober.probes if prober is not None else ctx.normal
                    row.normal = [p for p in probes if p.at >= row.started]  # during it
                row.details = ctx.details
                if server.returncode is not None:
                    row.verdict = f"SERVER DIED (exit {server.returncode}); {row.verdict}"
            row.log = server.events
    except Exception as exc:  # this row failed, not the table: the next attacks still run
        row.failed = True
        row.verdict = f"script failed: {type(exc).__name__}: {exc}"
        if not isinstance(exc, PhaseTimeout | ChildFailed):
            traceback.print_exception(exc)
    return row


def normal_text(probes: list[Probe]) -> str:
    if not probes:
        return "no call finished"
    ok = [p.seconds for p in probes if p.ok]
    word = "yes" if len(ok) == len(probes) else "partly" if ok else "no"
    text = f"{word} {len(ok)}/{len(probes)}"
    worst = max(p.seconds for p in probes)
    if ok:
        return f"{text}, p50 {ms(statistics.median(ok))}, max {ms(worst)}"
    return f"{text}, waited up to {ms(worst)}"


def print_table(rows: list[Row], plan: Plan, elapsed: float) -> None:
    def mib(value: float | None) -> str:
        return "?" if value is None else f"{value:,.0f} MiB"

    cells = []
    for row in rows:
        growth = (
            f"+{row.rss_max - row.rss_before:,.0f} MiB"
            if row.rss_max is not None and row.rss_before is not None
            else "?"
        )
        before, peak = mib(row.rss_before), mib(row.rss_max)
        cells.append((row.attack, before, peak, growth, row.verdict, normal_text(row.normal)))
    head = ("attack", "RSS before", "RSS max", "growth", "server verdict", "normal client served")
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    right = (False, True, True, True, False, False)

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        ).rstrip()

    print()
    print(
        f"attacks against fresh servers on 127.0.0.1 (server file limit "
        f"{plan.server_nofile}; {elapsed:.0f} s in all)"
    )
    print(line(head))
    print("-" * len(line(head)))
    for values in cells:
        print(line(values))
    print()
    for row in rows:
        print(f"{row.attack}:")
        for detail in row.details:
            print(f"  {detail}")
        failed = [p for p in row.normal if not p.ok]
        if failed:
            why = tally(Counter(p.error for p in failed))
            first, last = (p.at - row.started for p in (failed[0], failed[-1]))
            print(f"  normal client failures: {why} (started {first:.1f}-{last:.1f} s in)")
        if row.log:
            top = ", ".join(f"{e} x{n:,}" for e, n in row.log.most_common(6))
            print(f"  server log: {top}")
    print(
        "RSS: VmRSS of the server process, before the attack and its peak during it. Normal "
        "client: its echo calls (logins from 127.0.0.2 for wrong-passwords) while the attack "
        f"ran, served within {PROBE_TIMEOUT:g} s or not; p50 of the served, max of all."
    )


async def run_all(names: list[str], plan: Plan, code: str | None = None) -> list[Row]:
    rows: list[Row] = []
    # lone_errors_unwrapped: a Ctrl-C comes out as itself, and run_main says "interrupted"
    with (
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals,
        lone_errors_unwrapped(),
    ):
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    print(f"stopped by {signal.Signals(signum).name}", file=sys.stderr)
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            for name in names:
                rows.append(await run_attack(name, plan, code))
            nursery.cancel_scope.cancel()
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attacks",  # not "__main__.py"
        description=(benchmarks.attacks.__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--quick", action="store_true", help="shorter attacks (~1 min in all)")
    parser.add_argument(
        "--seconds", type=float, help="length of the non-reading attack (60; --quick: 10)"
    )
    parser.add_argument(
        "--attack", help=f"comma-separated subset of: {', '.join(ATTACKS)} (default: all)"
    )
    parser.add_argument(
        "--rss-limit",
        type=float,
        default=RSS_LIMIT,
        help="server RSS in MiB past which an attack stops pushing (4096)",
    )
    parser.add_argument(
        "--code",
        metavar="DIR",
        help="run the servers (and connect-deadline's client) from the pairlink checkout DIR "
        "(DIR/framework first on their PYTHONPATH): the 'before' of a before/after table",
    )
    parser.add_argument("--child", choices=("probe", "serve-users"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.attacks = list(ATTACKS)
    if args.attack:
        args.attacks = [a.strip() for a in args.attack.split(",") if a.strip()]
        unknown = set(args.attacks) - set(ATTACKS)
        if unknown:
            parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "probe":
        log_to_stderr("WARNING")
        trio.run(probe_main, args.url, args.fresh)
        return 0
    if args.child == "serve-users":
        log_to_stderr("INFO")
        serve_users()
        return 0
    log_to_stderr("WARNING")  # the password attack's clients log in this process
    plan = attrs.evolve(QUICK) if args.quick else Plan()
    if args.seconds is not None:
        plan.seconds = args.seconds
    plan.rss_limit = args.rss_limit
    started = time.monotonic()
    rows = trio.run(run_all, args.attacks, plan, args.code)
    print_table(rows, plan, time.monotonic() - started)
    return 1 if any(row.failed for row in rows) or len(rows) < len(args.attacks) else 0


if __name__ == "__main__":
    run_main(main)
