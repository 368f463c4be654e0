"""Issue 22's gateway rows: what one party of a gateway did to the others (the gateway, and
the echo server behind it, of ``hosts gateway``).

- ``gateway-no-route``: ``guest``, a user no route allows, opens 10,000 routing-node pairs
  (the gateway's ``max_pairs``) and sends nothing; then ``apps``, the allowed organisation,
  calls through the gateway on fresh connections.
- ``health-route``: ``$health check echo`` asked of the gateway by ``guest``, whose allow list
  denies that route.
- ``gateway-pairs``: ``apps`` opens 600 pairs through the gateway at once: how fast the gateway
  answers them, and another client's calls through it meanwhile.
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import trio

from benchmarks.attacks import hosts
from benchmarks.attacks.children import PROBE_TIMEOUT, Probe
from benchmarks.attacks.phases import STEP_TIMEOUT
from benchmarks.attacks.tenants import Opened, as_user, condition, open_pairs, served, try_call
from benchmarks.attacks.wire import Wire, wire_to
from pairlink import connect
from pairlink._amqp.performatives import ROLE_RECEIVER
from pairlink._amqp.sasl import SaslClient

if TYPE_CHECKING:
    from benchmarks.attacks.attacks import Ctx

PAIRS_PER_CONNECTION = 4_000
"""Pairs gateway-no-route opens on one connection: 8,000 links, under the 8,192 an engine
takes on one connection (``max_links``)."""
PAIRS_PER_SESSION = 500
"""Pairs gateway-pairs opens on one session: 1,000 links, under a session's handle-max
(1,023)."""
THROUGH_EVERY = 0.25
"""Seconds between two calls of the gateway rows' normal client (a fresh connection each)."""


async def calls_through(url: str, probes: list[Probe], *, calls: int | None = None) -> None:
    """The gateway rows' normal client: ``apps`` calls echo through the gateway, a fresh
    connection each time (a new pair), every :data:`THROUGH_EVERY` s, ``calls`` times (None:
    until cancelled)."""
    apps = as_user(url, hosts.APPS, hosts.GATEWAY_USERS[hosts.APPS])
    for _ in itertools.count() if calls is None else range(calls):
        at, started = time.time(), time.monotonic()
        served, error = False, "unanswered when the row ended"
        try:
            with trio.fail_after(PROBE_TIMEOUT):
                async with connect(apps, timeout=PROBE_TIMEOUT) as client:
                    await client.call(hosts.ROUTE, "echo", "x")
            served, error = True, ""
        except Exception as exc:  # not served: say how
            error = f"{type(exc).__name__}: {str(exc)[:60]}"
        finally:
            probes.append(Probe(served, time.monotonic() - started, error, at))
        await trio.sleep(THROUGH_EVERY)


async def gateway_no_route(ctx: Ctx) -> str:
    count = ctx.plan.tenants.node_pairs
    guest = SaslClient.plain(hosts.GUEST, hosts.GATEWAY_USERS[hosts.GUEST])
    connections = math.ceil(count / PAIRS_PER_CONNECTION)
    opened = Opened()
    async with AsyncExitStack() as stack:
        for k in range(connections):
            wire = await stack.enter_async_context(wire_to(ctx.url, guest))
            await stack.enter_async_context(wire.reading())
            size = min(PAIRS_PER_CONNECTION, count - k * PAIRS_PER_CONNECTION)
            opened.add(await open_pairs(wire, size, None, f"node{k}"))
        await calls_through(ctx.url, ctx.normal, calls=5)
    ctx.details.append(
        f"guest's {count:,} routing-node pairs on {connections} connections: {opened.text()}"
    )
    ctx.details.append(f"apps through the gateway meanwhile: {served(ctx.normal)}")
    return f"guest: {opened.text()}; apps {served(ctx.normal).split(' (')[0]}"


async def health_route(ctx: Ctx) -> str:
    answers = {}
    for user in (hosts.GUEST, hosts.APPS):
        url = as_user(ctx.url, user, hosts.GATEWAY_USERS[user])
        answers[user] = await try_call(url, "$health", "check", service=hosts.ROUTE)
    await ctx.probed()
    ctx.details += [
        f"{user} asks $health check({hosts.ROUTE!r}): {a}" for user, a in answers.items()
    ]
    return f"guest (denied the route) got: {answers[hosts.GUEST]}"


async def gateway_pairs(ctx: Ctx) -> str:
    sizes = ctx.plan.tenants
    count = sizes.gateway_pairs
    apps = SaslClient.plain(hosts.APPS, hosts.GATEWAY_USERS[hosts.APPS])
    answered_at: dict[int, float] = {}
    async with wire_to(ctx.url, apps) as wire, wire.reading(), trio.open_nursery() as nursery:
        nursery.start_soon(calls_through, ctx.url, ctx.normal)
        started = trio.current_time()
        with ctx.push(sizes.gateway_hold + STEP_TIMEOUT):
            opened = await _pairs_answered(wire, count, answered_at, started, sizes.gateway_hold)
        await ctx.probed()
        nursery.cancel_scope.cancel()
    times = sorted(answered_at.values())
    by_second = sum(t <= 1.0 for t in times)
    ctx.details.append(
        f"{count} pairs to {hosts.ROUTE!r} at once: {opened.text()}; answered within 1 s: "
        f"{by_second}, the last at {times[-1]:.1f} s"
        if times
        else "none answered"
    )
    ctx.details.append(f"another connection's calls meanwhile: {served(ctx.normal)}")
    return f"{len(times)}/{count} pairs answered ({by_second} in 1 s); other: {served(ctx.normal)}"


async def _pairs_answered(
    wire: Wire, count: int, answered_at: dict[int, float], started: float, hold: float
) -> Opened:
    """Like :func:`open_pairs`, noting when each pair's attach came back: pairs of
    ``PAIRS_PER_SESSION`` per session, within the server's handle-max."""

    def channel(k: int) -> int:
        return k // PAIRS_PER_SESSION

    for c in range(channel(count - 1) + 1):
        wire.begin(c)
    for k in range(count):
        wire.pair(channel(k), f"p-{k}", hosts.ROUTE, 2 * (k % PAIRS_PER_SESSION), 0)
    await wire.flush()

    def note() -> bool:
        for k in range(count):
            if k not in answered_at and wire.seen(channel(k), f"p-{k}", ROLE_RECEIVER):
                answered_at[k] = trio.current_time() - started
        return len(answered_at) == count or wire.ended

    await wire.wait_until(note, hold)
    opened = Opened(unanswered=count - len(answered_at))
    for k in answered_at:
        link = wire.seen(channel(k), f"p-{k}", ROLE_RECEIVER)
        if link is not None and link.detach is not None:
            opened.refused[condition(link.detach.error)] += 1
        else:
            opened.held += 1
    return opened
