"""Issue 22's CPU per byte: for each kind of frame, the server's CPU time per byte an attacker
sends, against a heartbeat's (``frames-<kind>`` rows of ``benchmarks.attacks``).

Each row sends bursts of one kind of frame, as fast as the server takes them, to a real
``python -m pairlink serve services.echo tests.hostile_services:BigBox`` child, for a tenth of
``--seconds`` (6 s; 1 s with ``--quick``). After each burst a frame the server must answer
(a session flow with ``echo``, or the answers the kind brings anyway) tells that the server has
handled all of it; the server process's CPU time (``utime + stime`` of ``/proc/<pid>/stat``)
over the bursts, divided by the bytes sent, is the row's figure, printed as a multiple of a
heartbeat's (the cheapest frame there is: measured first, or once per run). Issue 22's bound:
no kind costs more than 10x a heartbeat per byte.

Kinds: ``heartbeat`` (empty frames); ``sasl`` (a new connection's SASL header and init, until
the outcome); ``open-close`` (the same, then AMQP header, open and close); ``begin-end`` and
``attach-detach`` (a session, or a pair of links, begun and ended again on one connection);
``flow`` (link flows on a reply link); ``transfer`` (pre-settled echo calls, pipelined);
``disposition`` (non-settling one-id dispositions over 16,000 unsettled replies held) and
``disposition-wide`` (the issue's ``disposition(first=0, last=2^31-1)`` over them).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from benchmarks.attacks.phases import STEP_TIMEOUT, PhaseTimeout, phase
from benchmarks.attacks.wire import WINDOW, Wire, request, wire_to
from pairlink._amqp.framing import Frame
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
)
from pairlink._amqp.sasl import SaslClient
from pairlink._io.net import AmqpUrl

if TYPE_CHECKING:
    from benchmarks.attacks.attacks import Ctx

BURST_SHARE = 0.1
"""Each row's bursts last this share of ``--seconds`` (60 s, 10 with ``--quick``)."""
HELD = 16_000
"""Unsettled replies the disposition rows hold, as in the issue."""
HOLDING_PAIRS = 4
"""Pairs they are held on: 4,000 each, within a link's bound of 4,096."""
ROUND = 1024
"""Frames in one burst of a kind (fewer for the kinds that wait for answers)."""
CONNECTIONS = 8
"""Connections the sasl and open-close rows handshake at once."""
HEARTBEAT_ROW = "heartbeat"

_baseline: dict[str, float] = {}  # the heartbeat's seconds per byte, once measured in this run


class CountingWire(Wire):
    """A :class:`Wire` that also counts the frames the bursts wait for, keeps the credit of its
    request links and answers the server's drains on them (a fair service drains a link's
    credit when others wait, and revokes it from a link that does not answer)."""

    def __init__(self, stream: trio.SocketStream, sasl: SaslClient | None = None) -> None:
        super().__init__(stream, sasl)
        self.session_flows = 0  # flows without a handle: answers to our echo
        self.detaches = 0
        self.credit: dict[str, tuple[int, int]] = {}  # request link: the server's last
        # (delivery-count, link-credit)
        self.senders: dict[str, int] = {}  # request links whose drains we answer: our handle

    def _take(self, frame: Frame) -> None:
        super()._take(frame)
        match frame.performative:
            case Flow(handle=None):
                self.session_flows += 1
            case Flow(handle=int() as handle) as flow:
                channel = self._channels.get(frame.channel, frame.channel)
                link = self._handles.get((channel, handle))
                if link is not None:
                    count = flow.delivery_count or 0
                    self.credit[link.name] = (count, flow.link_credit or 0)
                    ours = self.senders.get(link.name)
                    if flow.drain and ours is not None:  # all the credit used: written by wait
                        self.credit[link.name] = (count + (flow.link_credit or 0), 0)
                        self.write(channel, self._drained(ours, count + (flow.link_credit or 0)))
            case Detach():
                self.detaches += 1

    async def sync(self, channel: int = 0) -> None:
        """Wait until the server has handled everything written before: it answers a session
        flow with ``echo`` only then."""
        seen = self.session_flows
        self.write(
            channel,
            Flow(
                next_incoming_id=None,
                incoming_window=WINDOW,
                next_outgoing_id=0,
                outgoing_window=WINDOW,
                echo=True,
            ),
        )
        await self.flush()
        await self.wait(lambda: self.session_flows > seen, "the echo of a flow")

    def available(self, name: str, sent: int = 0) -> int:
        """Credit left on our request link ``name`` once ``sent`` messages went on it."""
        count, credit = self.credit.get(name, (0, 0))
        return count + credit - sent

    def replies(self, name: str) -> int:
        link = self.seen(0, name, ROLE_SENDER)
        return link.replies if link is not None else 0

    @staticmethod
    def _drained(handle: int, delivery_count: int) -> Flow:
        return Flow(
            next_incoming_id=None,
            incoming_window=WINDOW,
            next_outgoing_id=0,
            outgoing_window=WINDOW,
            handle=handle,
            delivery_count=delivery_count,
            link_credit=0,
            drain=True,
        )

    async def wait(self, done: Callable[[], bool], what: str) -> None:
        """Wait (while ``reading``) until ``done()``, writing our answers to drains."""
        with phase(f"waiting for {what}", STEP_TIMEOUT):
            while not done() and not self.ended:
                await self.flush()
                await self.wait_until(done, 0.05)
        if not done():
            raise PhaseTimeout(f"no {what} from the server (it hung up)")


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, user and system (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listening_pid(url: str) -> int:
    """The pid of our process listening on ``url``'s port of 127.0.0.1 (``/proc/net/tcp``,
    then the process holding that socket)."""
    port = AmqpUrl.parse(url).port
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    inodes = {r[9] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port}
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets for fd in fds):
                return int(pid)
        except OSError:  # gone, or not ours
            continue
    raise RuntimeError(f"no process of ours listens on port {port}")


Burst = Callable[[int], Awaitable[tuple[int, int]]]
"""One burst of ``n`` (1 to ``ROUND``) units of a kind, written and waited for until the server
has handled it all: (frames, bytes) sent."""
Setup = Callable[[CountingWire, str], Awaitable[Burst]]
"""What a kind needs on the connection (and the server's url) before its bursts: its burst."""


async def measure(ctx: Ctx, setup: Setup) -> tuple[float, int]:
    """Server CPU seconds per byte over bursts of one kind for the row's time; frames sent."""
    pid = listening_pid(ctx.url)
    seconds = ctx.plan.seconds * BURST_SHARE
    async with wire_to(ctx.url, kind=CountingWire) as wire, wire.reading():
        assert isinstance(wire, CountingWire)
        wire.begin(0)
        await wire.flush()
        await wire.wait(lambda: 0 in wire.begins, "begin")
        burst = await setup(wire, ctx.url)
        frames = sent = 0
        size = 1  # doubled each burst up to ROUND: a slow kind still ends in time
        cpu, started = cpu_seconds(pid), time.monotonic()
        with phase("the bursts", seconds + STEP_TIMEOUT * 4):
            while time.monotonic() - started < seconds:
                more, size_sent = await burst(size)
                frames, sent = frames + more, sent + size_sent
                size = min(size * 2, ROUND)
        used = cpu_seconds(pid) - cpu
    return used / max(sent, 1), frames


def on_wire(write: Callable[[int], None], wire: CountingWire) -> Burst:
    """A burst that ``write``s its frames on ``wire`` and ends with a :meth:`CountingWire.sync`
    (the sync's few bytes count too)."""

    async def burst(n: int) -> tuple[int, int]:
        before = wire.sent
        write(n)
        await wire.sync()
        return n, wire.sent - before

    return burst


async def heartbeats(wire: CountingWire, url: str) -> Burst:
    def write(n: int) -> None:
        for _ in range(n):
            wire.heartbeat()

    return on_wire(write, wire)


async def handshakes(wire: CountingWire, url: str, *, open_too: bool) -> Burst:
    """New connections: SASL header and ANONYMOUS init until the outcome, then (``open_too``)
    AMQP header, open and close until the server's close."""
    parsed = AmqpUrl.parse(url)

    async def one(counts: list[int]) -> None:
        stream = await trio.open_tcp_stream(parsed.host, parsed.port)
        async with stream:
            peer = Wire(stream)
            await peer.handshake_step("SASL outcome", lambda: peer.sasl is not None)
            frames = 1
            if open_too:
                peer.open()
                await peer.handshake_step("open", lambda: peer.server_open is not None)
                peer.write(0, Close())
                await peer.handshake_step("close", lambda: peer.ended)
                frames += 2
            counts[0] += frames
            counts[1] += peer.sent

    async def burst(n: int) -> tuple[int, int]:
        counts = [0, 0]
        limiter = trio.CapacityLimiter(CONNECTIONS)

        async def limited() -> None:
            async with limiter:
                await one(counts)

        async with trio.open_nursery() as nursery:
            for _ in range(max(1, n // 16)):
                nursery.start_soon(limited)
        return counts[0], counts[1]

    return burst


async def sasl(wire: CountingWire, url: str) -> Burst:
    return await handshakes(wire, url, open_too=False)


async def open_close(wire: CountingWire, url: str) -> Burst:
    return await handshakes(wire, url, open_too=True)


async def begin_end(wire: CountingWire, url: str) -> Burst:
    async def burst(n: int) -> tuple[int, int]:
        before, ended = wire.sent, len(wire.ends)
        for _ in range(n):
            wire.begin(1)
            wire.write(1, End())
        await wire.flush()
        await wire.wait(lambda: len(wire.ends) >= ended + n, "end")
        return 2 * n, wire.sent - before

    return burst


async def attach_detach(wire: CountingWire, url: str) -> Burst:
    names = itertools.count()

    async def burst(n: int) -> tuple[int, int]:
        before, detached = wire.sent, wire.detaches
        for _ in range(n):
            wire.pair(0, f"pair-{next(names)}", "bigbox", 0, 1)  # two attaches and a flow
            wire.write(0, Detach(handle=0, closed=True))
            wire.write(0, Detach(handle=1, closed=True))
        await wire.flush()
        await wire.wait(lambda: wire.detaches >= detached + 2 * n, "detach")
        return 5 * n, wire.sent - before

    return burst


async def flows(wire: CountingWire, url: str) -> Burst:
    wire.pair(0, "flows", "bigbox", 0, 100)
    await wire.sync()

    def write(n: int) -> None:
        for k in range(n):
            wire.write(
                0,
                Flow(
                    next_incoming_id=0,
                    incoming_window=WINDOW,
                    next_outgoing_id=0,
                    outgoing_window=WINDOW,
                    handle=1,
                    delivery_count=0,
                    link_credit=100 + k % 2,
                ),
            )

    return on_wire(write, wire)


async def transfers(wire: CountingWire, url: str) -> Burst:
    wire.pair(0, "calls", "bigbox", 0, 2**31 - 1)
    wire.senders["calls"] = 0
    await wire.flush()
    await wire.wait(lambda: wire.available("calls") > 0, "credit")
    ids = itertools.count(1)
    sent = 0

    async def burst(n: int) -> tuple[int, int]:
        nonlocal sent
        before = wire.sent
        n = min(n, wire.available("calls", sent))
        for _ in range(n):
            wire.message(0, 0, request("echo", 1, next(ids)))
        sent += n
        await wire.flush()
        await wire.wait(lambda: wire.replies("calls") >= sent, "replies")
        await wire.wait(lambda: wire.available("calls", sent) > 0, "credit")
        return n, wire.sent - before

    return burst


async def held_replies(wire: CountingWire) -> None:
    """``HELD`` unsettled replies from bigbox, on ``HOLDING_PAIRS`` pairs, never settled."""
    per_pair = HELD // HOLDING_PAIRS
    ids = itertools.count(1)
    for k in range(HOLDING_PAIRS):  # one after another: each has the mailbox to itself
        name = f"hold-{k}"
        wire.pair(0, name, "bigbox", 2 * k, per_pair)
        wire.senders[name] = 2 * k
        await wire.flush()
        await wire.wait(lambda: wire.available(name) >= per_pair, "credit")  # noqa: B023
        for _ in range(per_pair):
            wire.message(0, 2 * k, request("echo", 1, next(ids)), settled=False)
        await wire.flush()
        await wire.wait(lambda: wire.replies(name) >= per_pair, "replies")  # noqa: B023


async def dispositions(wire: CountingWire, url: str, *, wide: bool) -> Burst:
    await held_replies(wire)
    ids = itertools.cycle(range(HELD))

    def write(n: int) -> None:
        for _ in range(n):
            first, last = (0, 2**31 - 1) if wide else (next(ids), None)
            wire.write(0, Disposition(role=ROLE_RECEIVER, first=first, last=last))

    return on_wire(write, wire)


async def one_id(wire: CountingWire, url: str) -> Burst:
    return await dispositions(wire, url, wide=False)


async def wide(wire: CountingWire, url: str) -> Burst:
    return await dispositions(wire, url, wide=True)


KINDS: dict[str, Setup] = {
    HEARTBEAT_ROW: heartbeats,
    "sasl": sasl,
    "open-close": open_close,
    "begin-end": begin_end,
    "attach-detach": attach_detach,
    "flow": flows,
    "transfer": transfers,
    "disposition": one_id,
    "disposition-wide": wide,
}
"""The kinds of frame, each a row ``frames-<kind>``; the heartbeat's first."""


def row(kind: str) -> Callable[[Ctx], Awaitable[str]]:
    """The attack of the row ``frames-<kind>``: its CPU per byte, and as a heartbeat's
    multiple (the heartbeat measured first on the same server when this run has not yet)."""

    async def run(ctx: Ctx) -> str:
        if HEARTBEAT_ROW not in _baseline:
            _baseline[HEARTBEAT_ROW], _ = await measure(ctx, heartbeats)
        per_byte, frames = await measure(ctx, KINDS[kind])
        await ctx.probed()
        base = _baseline[HEARTBEAT_ROW]
        ctx.details.append(
            f"{frames:,} frames; server CPU {per_byte * 1e9:,.1f} ns per byte sent, a "
            f"heartbeat's {base * 1e9:,.1f} ns"
        )
        return f"{per_byte * 1e9:,.1f} ns CPU/byte = {per_byte / base:,.1f}x a heartbeat's"

    return run
