"""The attacks (issues 9 and 22), how hard every attack pushes (:class:`Plan`), and the servers
they all attack (:data:`ATTACKS`)."""

from __future__ import annotations

import itertools
import math
import os
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import attrs
import trio

from benchmarks.attacks import frames, gateways, tenants
from benchmarks.attacks.children import (
    LISTEN,
    PASSWORD,
    PROBE_TIMEOUT,
    USER,
    Child,
    Probe,
    Prober,
)
from benchmarks.attacks.phases import STEP_TIMEOUT, PhaseTimeout, phase, tally
from benchmarks.attacks.wire import (
    BOMB_SIZE,
    CHUNK,
    MIB,
    OUR_HANDLE_MAX,
    LinkSeen,
    Wire,
    bomb_request,
    endless_head,
    request,
    wire_to,
)
from pairlink._amqp.messaging import Error
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER, Detach
from pairlink._amqp.sasl import SaslClient
from pairlink._io import net
from pairlink._io.net import AmqpUrl
from pairlink._rpc import wire as rpc_wire

SERVE = ("pairlink", "serve", "--listen", LISTEN)
"""``python -m pairlink serve ... --listen amqp://127.0.0.1:0``: the server of most attacks."""
HOST = ("benchmarks.attacks.hosts",)
"""``python -m benchmarks.attacks.hosts NAME``: the servers ``pairlink serve`` cannot start."""
SERVER_NOFILE = 1024
"""Open-file limit of every server process: the common default, so that the silent
connections can exhaust it as in the issue (1,050 idle connections locked every client out)."""
RSS_LIMIT = 4096
"""MiB of server RSS past which an attack stops pushing (the old behaviour of the non-reading
attack grows by gigabytes): the row then says so."""
STALL = 5.0
"""Seconds a write may block before the server counts as having stopped reading."""

PAYLOAD_SIZE = 16 << 10
"""The argument of each non-reading request."""
BATCH = 16
"""Requests written per ``send_all`` by the non-reading attacker."""
HUGE_CREDIT = 1_000_000_000
"""Reply credit of the non-reading attacker: more than it will ever read (a uint below 2^31)."""
PEEK = 3.0
"""Seconds the non-reading attacker reads afterwards, to see whether the server detached or
closed (bounded: an old server may have gigabytes of replies queued)."""
PARTIAL_LINKS = 8
"""Links (a session each) of the partial attacker."""
BOMB_WAIT = 60.0
"""Seconds the decode bomb's answer may take."""
AFTERMATH = 1.0
"""Seconds the normal client goes on after the decode bomb was answered (what it left behind)."""
LOGIN_EVERY = 0.5
"""Seconds between two right logins from 127.0.0.2 during the password attack."""
HEARTBEAT = 1.0
"""Seconds between the hoarders' heartbeats (well within any idle timeout)."""
LOGINS_CAP = 120.0
"""Seconds the wrong logins may take in all; the row says how many were tried by then."""


def said(error: Error | None, *, full: bool = True) -> str:
    """An AMQP error as condition (and the start of its description, if ``full``)."""
    if error is None:
        return "no error"
    text = str(error.condition)
    if full and error.description:
        text += f" ({error.description[:70]})"
    return text


@attrs.define
class Plan:
    """How hard each attack pushes (``--quick`` shrinks it)."""

    seconds: float = 60.0  # the non-reading attack
    partial_mib: int = 80  # per link: past the default 64 MiB max-message-size
    partial_seconds: float = 40.0
    links: int = 10_000
    hold: float = 10.0  # seconds the many-links attack holds its calls
    hoarders: int = 50  # connections of the hoarding attack, one request link each
    hoard: float = 15.0  # seconds they hold their credit: past the 5 s drain timeout
    silent: int = 1_500
    silent_wait: float = 15.0  # past the default handshake timeout of 10 s
    logins: int = 100
    rss_limit: float = RSS_LIMIT
    server_nofile: int = SERVER_NOFILE
    tenants: tenants.Sizes = attrs.field(factory=tenants.Sizes)  # issue 22's rows


QUICK = Plan(
    seconds=10.0,
    partial_mib=16,
    partial_seconds=10.0,
    links=2_000,
    hold=4.0,
    hoarders=5,
    hoard=8.0,
    silent_wait=12.0,
    logins=20,
    tenants=tenants.QUICK_SIZES,
)
"""``--quick``: about a minute for issue 9's rows, 90 s for issue 22's."""


@attrs.define(eq=False)
class Ctx:
    """What an attack gets: where to attack, how hard, where to note its numbers."""

    url: str
    plan: Plan
    prober: Prober | None = None
    server: Child | None = None  # the process attacked
    normal: list[Probe] = attrs.field(factory=list)  # the attack's own normal client, if any
    details: list[str] = attrs.field(factory=list)
    over_limit: bool = False  # the server's RSS passed the limit: the pushing stopped
    _pushes: list[trio.CancelScope] = attrs.field(factory=list)

    def push(self, seconds: float) -> trio.CancelScope:
        """``move_on_after(seconds)`` around the attack's main push, cut short once the
        server's RSS passes the limit (the attack then reports what it did so far)."""
        scope = trio.move_on_after(seconds)
        self._pushes.append(scope)
        if self.over_limit:
            scope.cancel()
        return scope

    def stop_pushing(self) -> None:
        self.over_limit = True
        for scope in self._pushes:
            scope.cancel()

    async def probed(self) -> None:
        """The end of the window in which the normal client is measured: call it while the
        attack still holds what it took."""
        if self.prober is not None:
            await self.prober.finish()


async def non_reading(ctx: Ctx) -> str:
    seconds = ctx.plan.seconds
    payload = bytes(PAYLOAD_SIZE)
    ids = itertools.count(1)
    requests, closed = 0, False
    async with wire_to(ctx.url) as wire:
        wire.begin(0)
        wire.pair(0, "flood", "bigbox", 0, HUGE_CREDIT)
        started = progress = trio.current_time()
        with ctx.push(seconds):
            try:
                while True:
                    for _ in range(BATCH):
                        wire.message(0, 0, request("echo", payload, next(ids)))
                    await wire.flush()
                    requests += BATCH
                    progress = trio.current_time()
            except trio.BrokenResourceError:
                closed = True
        ended = trio.current_time()
        stalled = ended - progress > STALL
        mib = wire.sent / MIB
        await ctx.probed()
        ctx.details.append(
            f"sent {mib:,.1f} MiB ({requests:,} requests of {PAYLOAD_SIZE >> 10} KiB) in "
            f"{ended - started:.1f} s; the last write finished at {progress - started:.1f} s"
        )
        if not closed:  # what the server said meanwhile (it may have queued much: bounded)

            def detach() -> Detach | None:
                link = wire.seen(0, "flood", ROLE_RECEIVER)  # the server's end of our sender
                return link.detach if link is not None else None

            await wire.read_until(lambda: wire.close is not None or detach() is not None, PEEK)
            replies = wire.seen(0, "flood", ROLE_SENDER)
            gone, close = detach(), wire.close
            ctx.details.append(
                f"then read {PEEK:g} s: {replies.replies if replies else 0:,} replies; link "
                + (f"detached: {said(gone.error)}" if gone else "attached")
                + "; connection "
                + (f"closed: {said(close.error)}" if close else "open")
            )
    if closed:
        return f"closed the connection after {mib:,.0f} MiB"
    if stalled:
        return f"stopped reading at {mib:,.0f} MiB ({progress - started:.1f} s)"
    return f"read all {mib:,.0f} MiB"


async def partial(ctx: Ctx) -> str:
    cap = ctx.plan.partial_mib * MIB
    names = [f"partial-{i}" for i in range(PARTIAL_LINKS)]
    async with wire_to(ctx.url) as wire, wire.reading():
        for channel, name in enumerate(names):
            wire.begin(channel)
            wire.pair(channel, name, "echo", 0, 1)
        with phase("attaching 8 links", STEP_TIMEOUT):
            await wire.flush()

        def request_link(channel: int) -> LinkSeen | None:  # the server's end
            return wire.seen(channel, names[channel], ROLE_RECEIVER)

        def credit(channel: int) -> int:
            seen = request_link(channel)
            return seen.max_credit if seen is not None else 0

        await wire.wait_until(lambda: all(map(credit, range(PARTIAL_LINKS))), STALL)
        granted = [channel for channel in range(PARTIAL_LINKS) if credit(channel)]
        if not granted:
            await ctx.probed()
            return f"granted no credit to the {PARTIAL_LINKS} links"
        room = wire.room
        head = endless_head()
        first = head + bytes(room - len(head))
        zeros = bytes(room)
        queued = dict.fromkeys(granted, 0)

        def going(channel: int) -> bool:  # until the server detaches it, or at the cap
            seen = request_link(channel)
            return queued[channel] < cap and (seen is None or seen.detach is None)

        stalled = False
        first_detach: float | None = None  # MiB sent when the server first detached a link
        started = trio.current_time()
        with ctx.push(ctx.plan.partial_seconds):
            try:
                while not wire.ended:
                    sending = [channel for channel in granted if going(channel)]
                    if first_detach is None and any(s.detach for s in wire.links.values()):
                        first_detach = wire.sent / MIB
                    if not sending:
                        break
                    for channel in sending:
                        for _ in range(max(1, CHUNK // room)):
                            start = queued[channel] == 0
                            wire.transfer(
                                channel, 0, first if start else zeros, first=start, more=True
                            )
                            queued[channel] += room
                    with trio.move_on_after(STALL) as blocked:
                        await wire.flush()
                    if blocked.cancelled_caught:
                        stalled = True
                        break
            except trio.BrokenResourceError:
                pass
        took = trio.current_time() - started
        await wire.wait_until(lambda: wire.ended, 0 if stalled else 1.0)  # a closing word
        mib = wire.sent / MIB
        await ctx.probed()
    detached = [s.detach for s in wire.links.values() if s.detach is not None]
    why = Counter(said(d.error, full=False) for d in detached)
    ctx.details.append(
        f"{len(granted)} links with credit; sent {mib:,.0f} MiB in {took:.1f} s, each link "
        f"until detached or {ctx.plan.partial_mib} MiB; detaches: "
        + (tally(why) or "none")
        + (f", the first after {first_detach:,.0f} MiB" if first_detach is not None else "")
    )
    if wire.close is not None:
        ctx.details.append(f"connection closed: {said(wire.close.error)}")
    parts = []
    if wire.close is not None:
        parts.append(f"closed: {said(wire.close.error, full=False)}")
    elif wire.eof:
        parts.append("dropped the connection")
    if detached:
        parts.append(f"detached {len(detached)} links: {why.most_common(1)[0][0]}")
    if stalled:
        parts.append("stopped reading")
    if not parts:
        parts.append("took it all, no refusal")
    return f"{', '.join(parts)} ({mib:,.0f} MiB sent)"


async def decode_bomb(ctx: Ctx) -> str:
    payload = bomb_request(1)
    async with wire_to(ctx.url) as wire, wire.reading():
        wire.begin(0)
        wire.pair(0, "bomb", "echo", 0, 10)
        await wire.flush()

        def sender() -> LinkSeen | None:  # the server's end of our request link
            return wire.seen(0, "bomb", ROLE_RECEIVER)

        def replies() -> LinkSeen | None:
            return wire.seen(0, "bomb", ROLE_SENDER)

        def granted() -> bool:
            link = sender()
            return wire.ended or (link is not None and link.max_credit > 0)

        if not await wire.wait_until(granted, STEP_TIMEOUT):
            raise PhaseTimeout("no credit for the bomb's link")
        started = trio.current_time()
        wire.message(0, 0, payload, settled=False)
        with phase("sending the 8 MiB bomb", STEP_TIMEOUT):
            await wire.flush()

        def answered() -> bool:
            links = (sender(), replies())
            return (
                wire.ended
                or bool(wire.dispositions)
                or any(s is not None and (s.detach or s.replies) for s in links)
            )

        await wire.wait_until(answered, BOMB_WAIT)
        took = trio.current_time() - started
        await wire.wait_until(lambda: wire.ended, AFTERMATH)
        await ctx.probed()
    short: list[str] = []  # for the table
    full: list[str] = []  # for the details

    def note(what: str, error: Error | None = None, text: str = "") -> None:
        short.append(f"{what} {said(error, full=False) if error else text[:30]}".rstrip())
        full.append(f"{what} {said(error) if error else text}".rstrip())

    got = replies()
    if got is not None and got.first_replies:
        app = got.first_replies[0].application_properties or {}
        note(
            f"reply {app.get(rpc_wire.STATUS_CODE)}",
            None,
            str(app.get(rpc_wire.STATUS_DESCRIPTION, "")),
        )
    for disposition in wire.dispositions:
        state = disposition.state
        note(type(state).__name__, getattr(state, "error", None))
    for link in (sender(), got):
        if link is not None and link.detach is not None:
            note("detach", link.detach.error)
    if wire.close is not None:
        note("close", wire.close.error)
    elif wire.eof:
        note("connection dropped")
    ctx.details.append(
        f"{BOMB_SIZE // 2:,} elements in {len(payload) / MIB:.1f} MiB; answered after "
        f"{took:.2f} s: " + ("; ".join(full) or "nothing")
    )
    return f"{'; '.join(short) or 'no answer'} ({took:.2f} s)"


async def many_links(ctx: Ctx) -> str:
    total = ctx.plan.links
    async with wire_to(ctx.url) as wire, wire.reading():
        wire.begin(0)
        await wire.flush()
        if not await wire.wait_until(lambda: 0 in wire.begins or wire.ended, STEP_TIMEOUT):
            raise PhaseTimeout("no begin from the server")
        if wire.ended:
            await ctx.probed()
            return f"closed at once: {said(wire.close.error if wire.close else None, full=False)}"
        per_session = (min(wire.begins[0].handle_max, OUR_HANDLE_MAX) + 1) // 2
        sessions = math.ceil(total / per_session)
        for channel in range(1, sessions):
            wire.begin(channel)
        ids = itertools.count(1)
        started = trio.current_time()
        with phase(f"pipelining {total:,} pairs and calls", STEP_TIMEOUT * 4):
            for k in range(total):
                channel, handle = divmod(k, per_session)
                wire.pair(channel, f"slow-{k}", "echo", 2 * handle, 1)
                wire.message(channel, 2 * handle, request("sleep", 30, next(ids)))
                if k % 256 == 255:
                    await wire.flush()
            await wire.flush()
        sent = trio.current_time() - started

        all_answered = await wire.wait_until(
            lambda: len(wire.links) >= 2 * total or wire.ended, STEP_TIMEOUT * 2
        )
        with ctx.push(ctx.plan.hold):  # the calls are held meanwhile
            await wire.wait_until(lambda: wire.ended, ctx.plan.hold)
        await ctx.probed()
    refused: Counter[str] = Counter()
    credited = answered = unanswered = 0
    for k in range(total):
        channel, name = k // per_session, f"slow-{k}"
        request_link = wire.seen(channel, name, ROLE_RECEIVER)  # the server's ends
        reply_link = wire.seen(channel, name, ROLE_SENDER)
        if request_link is None:
            unanswered += 1
            continue
        credited += request_link.max_credit > 0
        gone = request_link.detach or (reply_link.detach if reply_link else None)
        if gone is not None:
            refused[said(gone.error, full=False)] += 1
        elif reply_link is not None and reply_link.replies:
            answered += 1
    held = total - sum(refused.values()) - answered - unanswered
    ctx.details.append(
        f"{total:,} pairs on {sessions} sessions written in {sent:.1f} s; server attached "
        f"{total - unanswered:,}{'' if all_answered else ' (not all in time)'}, granted credit "
        f"to {credited:,}; answered {answered:,}; refused: "
        + (tally(dict(refused.most_common(3))) or "none")
    )
    if wire.ends:
        why = Counter(said(end.error, full=False) for end in wire.ends)
        ctx.details.append(f"sessions ended: {tally(why)}")
    if wire.close is not None:
        ctx.details.append(f"connection closed: {said(wire.close.error)}")
    verdict = f"held {held:,} calls"
    if refused:
        verdict += f", refused {sum(refused.values()):,} links"
    if wire.close is not None:
        verdict += f", closed: {said(wire.close.error, full=False)}"
    return verdict


def _attached(wire: Wire, name: str) -> Callable[[], bool]:
    return lambda: wire.seen(0, name, ROLE_RECEIVER) is not None


async def hoarders(ctx: Ctx) -> str:
    count = ctx.plan.hoarders
    async with AsyncExitStack() as stack:
        wires = [await stack.enter_async_context(wire_to(ctx.url)) for _ in range(count)]
        for k, wire in enumerate(wires):
            await stack.enter_async_context(wire.reading())
            wire.begin(0)
            wire.pair(0, f"hoard-{k}", "echo", 0, 1)
            await wire.flush()
        with phase(f"attaching {count} hoarding links", STEP_TIMEOUT):
            for k, wire in enumerate(wires):
                await wire.wait_until(_attached(wire, f"hoard-{k}"), STEP_TIMEOUT)
        started = trio.current_time()
        with ctx.push(ctx.plan.hoard):
            while True:  # never a transfer, never a drain answered: heartbeats only
                await trio.sleep(HEARTBEAT)
                for wire in wires:
                    wire.heartbeat()
                    await wire.flush()
        held = trio.current_time() - started
        await ctx.probed()
        links = [wire.seen(0, f"hoard-{k}", ROLE_RECEIVER) for k, wire in enumerate(wires)]
    credited = sum(1 for link in links if link is not None and link.max_credit > 0)
    gone = Counter(said(link.detach.error, full=False) for link in links if link and link.detach)
    ctx.details.append(
        f"{count} connections, one request link each; credit granted to {credited}; held "
        f"{held:.1f} s with heartbeats every {HEARTBEAT:g} s; detached: " + (tally(gone) or "none")
    )
    if gone:
        return f"revoked {sum(gone.values())} of {count} links' credit"
    return f"{credited} of {count} links kept their credit {held:.0f} s"


def _closed(stream: trio.SocketStream) -> bool:
    """A non-blocking read: EOF (or a reset) means the server has closed this connection."""
    try:
        return os.read(stream.socket.fileno(), 1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def silent(ctx: Ctx) -> str:
    count = ctx.plan.silent
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count + 256, hard), hard))
    parsed = AmqpUrl.parse(ctx.url)
    streams: list[trio.SocketStream] = []
    failed: Counter[str] = Counter()
    limiter = trio.CapacityLimiter(64)

    async def open_one() -> None:
        async with limiter:
            try:
                streams.append(await trio.open_tcp_stream(parsed.host, parsed.port))
            except OSError as exc:
                failed[type(exc).__name__] += 1

    try:
        started = trio.current_time()
        with phase(f"opening {count:,} connections", STEP_TIMEOUT * 2):
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(open_one)
        opened = trio.current_time() - started
        await trio.sleep(1.0)  # the refusals of a connection limit are immediate
        at_once = sum(map(_closed, streams))
        with ctx.push(max(0.0, ctx.plan.silent_wait - (trio.current_time() - started))):
            await trio.sleep_forever()
        still_open = sum(not _closed(s) for s in streams)
        await ctx.probed()
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)
    ctx.details.append(
        f"{len(streams):,} connected in {opened:.1f} s"
        + (f" ({tally(failed)} failed)" if failed else "")
        + f"; closed within 1 s: {at_once:,}; still open at {ctx.plan.silent_wait:g} s: "
        f"{still_open:,}"
    )
    return f"{still_open:,} of {len(streams):,} still open at {ctx.plan.silent_wait:g} s"


async def login_from(url: str, local_address: str) -> float:
    """Seconds one login takes with our client's engine (TCP from ``local_address``, SASL
    PLAIN, the server's open)."""
    started = time.monotonic()
    parsed = AmqpUrl.parse(url)
    stream = await trio.open_tcp_stream(parsed.host, parsed.port, local_address=local_address)
    config = net.client_config(parsed)
    async with net.open_connection(stream, config, initiator=True, peer=url) as conn:
        await conn.wait_opened()
        return time.monotonic() - started


async def wrong_login(url: str) -> str:
    """One wrong password, as fast as a peer can try: SASL header and PLAIN init at once,
    then the outcome (our client would spend a second closing politely after it)."""
    parsed = AmqpUrl.parse(url)
    stream = await trio.open_tcp_stream(parsed.host, parsed.port)
    async with stream:
        wire = Wire(stream, SaslClient.plain(USER, "wrong"))
        await wire.flush()
        await wire.read_until(lambda: wire.sasl is not None, STEP_TIMEOUT)
    if wire.sasl is not None:
        return "accepted!" if wire.sasl.code == 0 else f"refused (code {wire.sasl.code})"
    return "hung up" if wire.eof else "no outcome"


async def wrong_passwords(ctx: Ctx) -> str:
    parsed = AmqpUrl.parse(ctx.url)
    right = f"amqp://{USER}:{PASSWORD}@{parsed.host}:{parsed.port}"
    outcomes: Counter[str] = Counter()
    throttled = trio.Event()  # a few wrong logins have failed: now the right one is timed
    done = trio.Event()

    async def right_logins() -> None:
        await throttled.wait()
        while not done.is_set():
            at, started = time.time(), time.monotonic()
            try:
                with trio.fail_after(PROBE_TIMEOUT):
                    seconds = await login_from(right, "127.0.0.2")
            except Exception as exc:  # not served: say how
                error = type(exc).__name__
                ctx.normal.append(Probe(False, time.monotonic() - started, error, at))
            else:
                ctx.normal.append(Probe(True, seconds, at=at))
            with trio.move_on_after(LOGIN_EVERY):
                await done.wait()

    started = trio.current_time()
    count = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(right_logins)
        with ctx.push(LOGINS_CAP) as capped:
            while count < ctx.plan.logins:
                try:
                    outcomes[await wrong_login(ctx.url)] += 1
                except OSError as exc:
                    outcomes[type(exc).__name__] += 1
                count += 1
                if count == 5:
                    throttled.set()
        took = trio.current_time() - started
        throttled.set()
        done.set()
    ctx.details.append(
        f"{count} wrong logins from 127.0.0.1 in {took:.2f} s"
        f"{' (capped)' if capped.cancelled_caught else ''}: "
        + tally(outcomes)
        + f"; right logins from 127.0.0.2 meanwhile: {len(ctx.normal)}"
    )
    return f"{count} wrong in {took:.2f} s ({took / max(count, 1):.3f} s each)"


@attrs.frozen
class Attack:
    """One attack: what it runs, against which server, with which normal client."""

    run: Callable[[Ctx], Awaitable[str]]
    server: tuple[str, ...]  # ``python -m`` arguments of its server
    probe: str | None  # the normal client: "persistent", "fresh", or None (the attack's own)
    budget: Callable[[Plan], float]  # seconds, all phases included


ATTACKS = {
    "non-reading": Attack(
        non_reading,
        (*SERVE, "services.echo", "tests.hostile_services:BigBox"),
        "persistent",
        lambda plan: plan.seconds + PEEK + 90,
    ),
    "partial": Attack(
        partial, (*SERVE, "services.echo"), "persistent", lambda plan: plan.partial_seconds + 90
    ),
    "decode-bomb": Attack(
        decode_bomb, (*SERVE, "services.echo"), "persistent", lambda plan: BOMB_WAIT + 90
    ),
    "many-links": Attack(
        many_links, (*SERVE, "services.echo"), "persistent", lambda plan: plan.hold + 300
    ),
    "silent": Attack(silent, (*SERVE, "services.echo"), "fresh", lambda p: p.silent_wait + 120),
    "hoarders": Attack(hoarders, (*SERVE, "services.echo"), "fresh", lambda p: p.hoard + 90),
    "wrong-passwords": Attack(
        wrong_passwords,
        ("benchmarks.attacks", "--child", "serve-users"),
        None,
        lambda plan: LOGINS_CAP + 60,
    ),
    **{
        f"frames-{kind}": Attack(
            frames.row(kind),
            (*SERVE, "services.echo", "tests.hostile_services:BigBox"),
            "persistent",
            lambda plan: plan.seconds * frames.BURST_SHARE * 2 + 120,
        )
        for kind in frames.KINDS
    },
    # issue 22: several parties, one process (tenants.py; their servers: hosts.py)
    "dedup-cross-caller": Attack(
        tenants.dedup_cross_caller, (*HOST, "bank"), None, lambda plan: 60
    ),
    "dedup-memory": Attack(
        tenants.dedup_memory,
        (*SERVE, "services.echo", "benchmarks.attacks.hosts:Keep"),
        "persistent",
        lambda plan: STEP_TIMEOUT * 4 + 90,
    ),
    "gateway-no-route": Attack(
        gateways.gateway_no_route, (*HOST, "gateway"), None, lambda plan: STEP_TIMEOUT * 4 + 90
    ),
    "links-per-process": Attack(
        tenants.links_per_process,
        (*SERVE, "services.echo"),
        "fresh",
        lambda plan: STEP_TIMEOUT * 6 + 90,
    ),
    "metrics-scrape": Attack(
        tenants.metrics_scrape,
        (*SERVE, "--metrics-listen", "127.0.0.1:0", "services.echo"),
        None,
        lambda plan: STEP_TIMEOUT * 2 + 90,
    ),
    "running-slots": Attack(
        tenants.running_slots,
        (*SERVE, "services.echo"),
        "persistent",
        lambda plan: plan.tenants.slow_hold + 90,
    ),
    "connect-deadline": Attack(
        tenants.connect_deadline, (*HOST, "connect-deadline"), None, lambda plan: 180
    ),
    "worker-stop": Attack(
        tenants.worker_stop, (*SERVE, "--workers", "2", "services.echo"), None, lambda plan: 90
    ),
    "health-route": Attack(gateways.health_route, (*HOST, "gateway"), None, lambda plan: 60),
    "gateway-pairs": Attack(
        gateways.gateway_pairs,
        (*HOST, "gateway"),
        None,
        lambda plan: plan.tenants.gateway_hold + 90,
    ),
}
