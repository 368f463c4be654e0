"""Issue 22's attacks: several parties sharing one server, each row what one party did to the
others (its server, where not ``pairlink serve``, is one of :mod:`.hosts`; the gateway's rows
are in :mod:`.gateways`).

- ``dedup-cross-caller``: bob (refused 403 by the bank's middleware) repeats alice's
  message-id, on her operation and on another; then bob calls first and alice repeats *his*
  id. Does bob read her reply; does her transfer run?
- ``dedup-memory``: calls to a deduplicating echo with unique 64 KiB message-ids and 256 KiB
  arguments: the server's RSS once they are answered (what the store holds for its window).
- ``links-per-process``: 30 anonymous connections x 8,000 links (4,000 pairs, no call; kept
  alive by heartbeats): the server's RSS, the refusals, and the memory one link costs (KiB: RSS
  growth over the links held before any refusal).
- ``metrics-scrape``: 8 sockets holding half an HTTP request and 3,000 idle ones against
  ``--metrics-listen``: how many of 25 scrapes succeed, 2 s each.
- ``running-slots``: one connection with 10,000 concurrent ``sleep(30)`` calls to echo
  (``max_concurrency=64``): the normal client's quick calls meanwhile, on a connection of its
  own.
- ``connect-deadline``: ``connect(url, timeout=2)`` against a listener that never speaks: when it
  raises; and how long leaving ``connect()`` takes against a peer deaf to close (the client
  under test runs in the host process, from ``--code``).
- ``worker-stop``: ``serve --workers 2``, one worker SIGSTOPped: the share of 20 fresh
  connections served, until when the supervisor replaces it, and the share served after.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import signal
import statistics
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from benchmarks.attacks import hosts
from benchmarks.attacks.children import PROBE_TIMEOUT, Probe, rss_mib
from benchmarks.attacks.phases import STEP_TIMEOUT, PhaseTimeout, phase, tally
from benchmarks.attacks.wire import OUR_HANDLE_MAX, Wire, wire_to
from pairlink import Client, RemoteError, connect
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER
from pairlink._io.net import AmqpUrl
from tests.scraping import http_get

if TYPE_CHECKING:
    from benchmarks.attacks.attacks import Ctx

KIB = 1 << 10
ID_SIZE = 64 * KIB
"""Characters of each dedup-memory message-id (the store used to keep any)."""
ARGUMENT_SIZE = 256 * KIB
"""Bytes of each dedup-memory argument (its echo is the reply kept)."""
IN_FLIGHT = 8
"""dedup-memory's calls in flight at once."""
SETTLE = 1.0
"""Seconds after a push before the server's RSS is read (what it still holds)."""
KEEPALIVE = 5.0
"""Seconds between heartbeats on links-per-process' connections: well within the server's idle
timeout, which would otherwise close them (and free their links) during the row."""
HALF_OPEN = 8
"""Sockets holding half an HTTP request against the metrics endpoint."""
SCRAPES = 25
SCRAPE_WAIT = 2.0
"""Seconds a scrape may take before it counts as failed."""
SLOW_SECONDS = 30.0
"""How long each of running-slots' slow calls sleeps."""
WORKER_CALLS = 20
"""Fresh connections worker-stop tries at once, before and after the replacement."""
WORKER_CALL_WAIT = 3.0
"""Seconds one of them may take (a healthy worker answers in milliseconds)."""
REPLACED_WITHIN = 20.0
"""Seconds worker-stop waits for the supervisor to replace the stopped worker."""


@attrs.define
class Sizes:
    """How hard issue 22's rows push (``--quick`` shrinks the long ones)."""

    dedup_calls: int = 2_000
    node_pairs: int = 10_000  # the gateway's default max_pairs: fewer prove nothing
    link_connections: int = 30
    links_per_connection: int = 8_000
    idle_sockets: int = 3_000
    slow_calls: int = 10_000
    slow_hold: float = 10.0  # seconds the quick caller is measured beside the slow calls
    gateway_pairs: int = 600
    gateway_hold: float = 10.0  # seconds the 600 pairs' answers are awaited at most


QUICK_SIZES = Sizes(dedup_calls=500, link_connections=10, slow_hold=5.0, gateway_hold=5.0)


def as_user(url: str, user: str, password: str) -> str:
    return url.replace("amqp://", f"amqp://{user}:{password}@", 1)


def condition(error: object) -> str:
    """The AMQP condition of a detach's or close's error (``error`` None: none)."""
    return str(getattr(error, "condition", "no error"))


def _server_pid(ctx: Ctx) -> int:
    assert ctx.server is not None
    return ctx.server.proc.pid


async def try_call(url: str, address: str, operation: str, /, *args: object, **kw: object) -> str:
    """What one call got: its reply, or the status and text of its refusal."""
    async with connect(url, timeout=PROBE_TIMEOUT) as client:
        try:
            return repr(await client.call(address, operation, *args, **kw))  # type: ignore[arg-type]
        except RemoteError as exc:
            return f"{exc.status} {exc.message}"


async def dedup_cross_caller(ctx: Ctx) -> str:
    alice = as_user(ctx.url, "alice", hosts.BANK_USERS["alice"])
    bob = as_user(ctx.url, "bob", hosts.BANK_USERS["bob"])
    first = await try_call(alice, "bank", "transfer", "carol", 10, message_id="m-1")
    same = await try_call(bob, "bank", "transfer", "carol", 10, message_id="m-1")
    other = await try_call(bob, "bank", "ran", message_id="m-1")
    his = await try_call(bob, "bank", "transfer", "dave", 5, message_id="m-2")
    hers = await try_call(alice, "bank", "transfer", "dave", 5, message_id="m-2")
    ran = await try_call(alice, "bank", "ran")
    ctx.details += [
        f"alice transfer(carol, 10) id m-1: {first}",
        f"bob   transfer(carol, 10) id m-1: {same}",
        f"bob   ran()               id m-1: {other}",
        f"bob   transfer(dave, 5)   id m-2: {his}",
        f"alice transfer(dave, 5)   id m-2: {hers}",
        f"transfers that ran: {ran}",
    ]
    read = [what for what, got in (("same call", same), ("other op", other)) if got == first]
    verdict = f"bob got alice's reply ({', '.join(read)})" if read else "bob refused (403) both"
    ran_hers = "'dave', 5" in ran
    if ran_hers:
        return f"{verdict}; alice's call with bob's id ran"
    return f"{verdict}; alice's call with bob's id NEVER RAN (she got {hers})"


async def dedup_memory(ctx: Ctx) -> str:
    count = ctx.plan.tenants.dedup_calls
    before = rss_mib(_server_pid(ctx)) or 0.0
    argument = bytes(ARGUMENT_SIZE)
    done = 0
    started = trio.current_time()
    async with connect(ctx.url, timeout=STEP_TIMEOUT) as client:
        ids = iter(range(count))

        async def caller() -> None:
            nonlocal done
            for n in ids:
                message_id = f"{n:08d}".ljust(ID_SIZE, "x")
                await client.call("keep", "echo", argument, message_id=message_id)
                done += 1

        with ctx.push(STEP_TIMEOUT * 4):
            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(caller)
    took = trio.current_time() - started
    await trio.sleep(SETTLE)
    after = rss_mib(_server_pid(ctx)) or 0.0
    await ctx.probed()
    sent = done * (ID_SIZE + ARGUMENT_SIZE) / (1 << 20)
    ctx.details.append(
        f"{done:,} calls ({sent:,.0f} MiB of ids and arguments) in {took:.1f} s; server RSS "
        f"{before:,.0f} MiB before, {after:,.0f} MiB {SETTLE:g} s after the last reply"
    )
    return f"+{after - before:,.0f} MiB held after {done:,} calls (window 60 s)"


@attrs.define
class Opened:
    """What the server answered to a peer's pairs."""

    held: int = 0
    refused: Counter[str] = attrs.field(factory=Counter)
    unanswered: int = 0
    closed: str | None = None  # the connection's close condition, if it closed

    def add(self, other: Opened) -> None:
        self.held += other.held
        self.refused += other.refused
        self.unanswered += other.unanswered
        self.closed = self.closed or other.closed

    def text(self) -> str:
        parts = [f"held {self.held:,}"]
        parts += [f"refused {n:,} ({c})" for c, n in self.refused.most_common(2)]
        if self.unanswered:
            parts.append(f"unanswered {self.unanswered:,}")
        if self.closed:
            parts.append(f"connection closed ({self.closed})")
        return ", ".join(parts)


async def open_pairs(wire: Wire, count: int, address: str | None, prefix: str) -> Opened:
    """``count`` pairs to ``address`` on as many sessions as the server's handle-max needs,
    no credit, pipelined; once each is answered (or the connection ends), what became of them.
    ``wire`` must be ``reading``."""
    wire.begin(0)
    await wire.flush()
    if not await wire.wait_until(lambda: 0 in wire.begins or wire.ended, STEP_TIMEOUT):
        raise PhaseTimeout("no begin from the server")
    opened = Opened()
    if wire.ended:
        opened.closed = condition(wire.close.error if wire.close else None)
        opened.unanswered = count
        return opened
    per_session = (min(wire.begins[0].handle_max, OUR_HANDLE_MAX) + 1) // 2
    for channel in range(1, math.ceil(count / per_session)):
        wire.begin(channel)
    with phase(f"writing {count:,} pairs", STEP_TIMEOUT * 2):
        for k in range(count):
            channel, handle = divmod(k, per_session)
            wire.pair(channel, f"{prefix}-{k}", address, 2 * handle, 0)
            if k % 256 == 255:
                await wire.flush()
        await wire.flush()
    names = [(k // per_session, f"{prefix}-{k}") for k in range(count)]

    def answered() -> bool:
        return wire.ended or all(wire.seen(c, n, ROLE_RECEIVER) for c, n in names[-1:])

    await wire.wait_until(answered, STEP_TIMEOUT * 2)
    await wire.wait_until(lambda: wire.ended, SETTLE)  # the refusals' detaches, if any
    for channel, name in names:
        request_link = wire.seen(channel, name, ROLE_RECEIVER)
        reply_link = wire.seen(channel, name, ROLE_SENDER)
        gone = request_link.detach if request_link else None
        gone = gone or (reply_link.detach if reply_link else None)
        if request_link is None:
            opened.unanswered += 1
        elif gone is not None:
            opened.refused[condition(gone.error)] += 1
        elif channel in wire.ended_sessions:  # its session ended: the link with it
            opened.refused[f"session ended: {condition(wire.ended_sessions[channel].error)}"] += 1
        else:
            opened.held += 1
    if wire.close is not None:
        opened.closed = condition(wire.close.error)
    return opened


def served(probes: list[Probe]) -> str:
    """How many of a normal client's calls were served, how fast, and the others' worst wait."""
    ok = [p.seconds for p in probes if p.ok]
    text = f"{len(ok)}/{len(probes)} served"
    if ok:
        text += f" (p50 {statistics.median(ok) * 1e3:,.0f} ms, max {max(ok) * 1e3:,.0f} ms)"
    failed = [p for p in probes if not p.ok]
    if failed:
        (error, count), *_ = Counter(p.error for p in failed).most_common(1)
        text += f"; {count}x {error}, waited up to {max(p.seconds for p in failed):.1f} s"
    return text


def _more_files(count: int) -> None:
    """Let this process hold ``count`` more sockets (up to its hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count + 256, hard), hard))


async def _keep_alive(wires: list[Wire]) -> None:
    """Heartbeats on ``wires`` (the list grows), so that the server's idle timeout never
    closes a connection whose links the attack holds."""
    while True:
        await trio.sleep(KEEPALIVE)
        for wire in wires:
            if not wire.ended:
                wire.heartbeat()
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await wire.flush()


async def links_per_process(ctx: Ctx) -> str:
    sizes = ctx.plan.tenants
    pairs = sizes.links_per_connection // 2
    before = rss_mib(_server_pid(ctx)) or 0.0
    opened: list[Opened] = []
    wires: list[Wire] = []
    unrefused: tuple[int, float] = (0, before)  # links held, RSS: while none was refused
    started = trio.current_time()
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(_keep_alive, wires)
        for k in range(sizes.link_connections):
            wire = await stack.enter_async_context(wire_to(ctx.url))
            await stack.enter_async_context(wire.reading())
            opened.append(await open_pairs(wire, pairs, "echo", f"c{k}"))
            wires.append(wire)
            if not any(o.refused for o in opened):
                unrefused = (2 * sum(o.held for o in opened), rss_mib(_server_pid(ctx)) or 0.0)
        took = trio.current_time() - started
        await trio.sleep(SETTLE)
        after = rss_mib(_server_pid(ctx)) or 0.0
        await ctx.probed()
        total = Opened()
        for wire, one in zip(wires, opened, strict=True):
            if wire.ended and one.held:  # closed since: its links are held no more
                gone = condition(wire.close.error) if wire.close else "dropped"
                one.refused[f"connection closed since: {gone}"] += one.held
                one.held = 0
            total.add(one)
        nursery.cancel_scope.cancel()
    links, measured = 2 * total.held, unrefused[0]
    per_link = (unrefused[1] - before) * KIB / measured if measured else 0.0
    ctx.details.append(
        f"{sizes.link_connections} connections x {2 * pairs:,} links written in {took:.1f} s: "
        f"pairs {total.text()}; server RSS {before:,.0f} -> {after:,.0f} MiB; a link: RSS "
        f"growth over the {measured:,} links held before any refusal"
    )
    refused = sum(total.refused.values())
    return (
        f"{links:,} links held; {refused:,} pairs refused"
        + (f" ({total.refused.most_common(1)[0][0]}...)" if refused else "")
        + f"; {per_link:.1f} KiB a link"
    )


async def metrics_scrape(ctx: Ctx) -> str:
    server = ctx.server
    assert server is not None
    await server.wait_for(lambda: "metrics.listening" in server.listening, STEP_TIMEOUT, "metrics")
    url = server.listening["metrics.listening"]
    idle = ctx.plan.tenants.idle_sockets
    _more_files(idle + HALF_OPEN)
    parsed = AmqpUrl.parse(url.replace("http://", "amqp://").removesuffix("/metrics"))
    held: list[trio.SocketStream] = []
    failed: Counter[str] = Counter()

    async def hold(data: bytes) -> None:
        try:
            stream = await trio.open_tcp_stream(parsed.host, parsed.port)
            if data:
                await stream.send_all(data)
            held.append(stream)
        except OSError as exc:
            failed[type(exc).__name__] += 1

    ok, why = 0, Counter[str]()
    try:
        with phase("opening the stalling sockets", STEP_TIMEOUT * 2):
            for _ in range(HALF_OPEN):
                await hold(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc")
            limiter = trio.CapacityLimiter(64)
            async with trio.open_nursery() as nursery:
                for _ in range(idle):

                    async def one() -> None:
                        async with limiter:
                            await hold(b"")

                    nursery.start_soon(one)
        for _ in range(SCRAPES):
            try:
                with trio.fail_after(SCRAPE_WAIT):
                    status, _, body = await http_get(url)
                good = status.split(" ")[1:2] == ["200"] and b"pairlink_" in body
                ok += good
                if not good:
                    why[status[:30] or "closed, no answer"] += 1
            except (trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                why[type(exc).__name__] += 1
        await ctx.probed()
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)
    ctx.details.append(
        f"{HALF_OPEN} half requests and {len(held) - HALF_OPEN:,} idle sockets held"
        + (f" ({tally(failed)} failed)" if failed else "")
        + f"; scrapes failed: {tally(why) or 'none'}"
    )
    return f"{ok} of {SCRAPES} scrapes succeeded ({SCRAPE_WAIT:g} s each)"


async def running_slots(ctx: Ctx) -> str:
    sizes = ctx.plan.tenants
    outcomes: Counter[str] = Counter()

    async def slow(client: Client) -> None:
        try:
            await client.call("echo", "sleep", SLOW_SECONDS)
            outcomes["answered"] += 1
        except Exception as exc:  # counted by kind: the row is about the other caller
            outcomes[type(exc).__name__] += 1

    async with (
        connect(ctx.url, timeout=SLOW_SECONDS * 2) as client,
        trio.open_nursery() as nursery,
    ):
        for _ in range(sizes.slow_calls):
            nursery.start_soon(slow, client)
        await trio.sleep(SETTLE)  # the calls pipelined: the other caller is measured from now
        flooded = time.time()
        with ctx.push(sizes.slow_hold):
            await trio.sleep_forever()
        await ctx.probed()
        nursery.cancel_scope.cancel()
    assert ctx.prober is not None
    quick = [p for p in ctx.prober.probes if p.at >= flooded]
    ctx.details.append(
        f"{sizes.slow_calls:,} sleep({SLOW_SECONDS:g}) calls on one connection, held "
        f"{sizes.slow_hold:g} s; their outcomes by then: " + (tally(outcomes) or "none finished")
    )
    return f"another caller's echo beside them: {served(quick)}"


async def connect_deadline(ctx: Ctx) -> str:
    server = ctx.server
    assert server is not None
    await server.wait_for(
        lambda: any(m.get("what") == "leave" for m in server.messages),
        hosts.GIVE_UP * 2 + STEP_TIMEOUT,
        "the client's timings",
    )
    said = {m["what"]: m for m in server.messages if "what" in m}
    await ctx.probed()
    first, leave = said["connect"], said["leave"]
    ctx.details.append(
        f"connect(timeout={hosts.DEADLINE:g}) to a listener that never speaks: "
        f"{first['s']:.2f} s, {first['error'] or 'no error'}"
    )
    opened = said["open and leave"]
    ctx.details.append(
        f"against a peer deaf to close: {opened['error'] or 'opened'}, leaving took "
        f"{leave['s']:.2f} s"
    )
    return f"raised after {first['s']:.1f} s; leaving took {leave['s']:.1f} s"


def _workers(supervisor: int) -> set[int]:
    """The supervisor's child processes (whichever of its threads started them)."""
    workers: set[int] = set()
    for children in Path(f"/proc/{supervisor}/task").glob("*/children"):
        with contextlib.suppress(FileNotFoundError):
            workers.update(int(pid) for pid in children.read_text().split())
    return workers


async def _fresh_calls(url: str) -> list[Probe]:
    """:data:`WORKER_CALLS` fresh connections at once, each calling echo once."""
    probes: list[Probe] = []

    async def one() -> None:
        at, started = time.time(), time.monotonic()
        try:
            with trio.fail_after(WORKER_CALL_WAIT):
                async with connect(url, timeout=WORKER_CALL_WAIT) as client:
                    await client.call("echo", "echo", "x")
        except Exception as exc:  # not served: say how
            probes.append(Probe(False, time.monotonic() - started, type(exc).__name__, at))
        else:
            probes.append(Probe(True, time.monotonic() - started, at=at))

    async with trio.open_nursery() as nursery:
        for _ in range(WORKER_CALLS):
            nursery.start_soon(one)
    return probes


def _end_workers(supervisor: int, started: set[int]) -> None:
    """Kill every worker, the supervisor stopped first (SIGSTOP: it restarts none, and the
    SIGKILL that ends every row still ends it). That SIGKILL alone would leave the workers
    running: they outlive a killed supervisor whose log pipe is closed."""
    os.kill(supervisor, signal.SIGSTOP)
    for pid in started | _workers(supervisor):
        if rss_mib(pid) is not None:
            os.kill(pid, signal.SIGKILL)


async def worker_stop(ctx: Ctx) -> str:
    server = ctx.server
    assert server is not None
    await server.wait_for(lambda: "serve.listening" in server.listening, STEP_TIMEOUT, "serving")
    workers = _workers(server.proc.pid)
    if len(workers) != 2:
        raise PhaseTimeout(f"expected 2 workers, found {sorted(workers)}")
    wedged = min(workers)
    os.kill(wedged, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        during = await _fresh_calls(ctx.url)
        replaced: float | None = None

        def back() -> bool:  # a new worker beside the other: it logs as it starts
            now = _workers(server.proc.pid)
            return len(now) == 2 and wedged not in now

        try:
            await server.wait_for(back, REPLACED_WITHIN - (time.monotonic() - stopped), "a new one")
            replaced = time.monotonic() - stopped
        except PhaseTimeout:
            pass
        after = await _fresh_calls(ctx.url)
        await ctx.probed()
    finally:
        _end_workers(server.proc.pid, workers)
    ctx.normal += during + after
    ctx.details.append(f"worker {wedged} stopped; {WORKER_CALLS} fresh calls: {served(during)}")
    ctx.details.append(
        (
            f"replaced after {replaced:.1f} s"
            if replaced
            else f"not replaced in {REPLACED_WITHIN:g} s"
        )
        + f"; then {served(after)}"
    )
    return (
        f"{sum(p.ok for p in during)}/{WORKER_CALLS} served while stopped; "
        + (f"replaced after {replaced:.1f} s" if replaced else "never replaced")
        + f"; {sum(p.ok for p in after)}/{WORKER_CALLS} served after"
    )
