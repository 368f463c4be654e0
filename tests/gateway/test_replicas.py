"""A gateway route over several replicas (issue 23), against servers of this process over real
TCP on 127.0.0.1: new pairs spread over every replica by the placement rule, a stopped replica
gets none (its callers' next calls go to the others, none fails) and is used again once back,
and the route's ``$health`` says ``serving`` while any replica is, with each one's state."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import pytest
import trio

from pairlink import Client, connect, handler, open_server, service
from pairlink._client.placement import DRAINING, READY
from pairlink._server.serving import Server
from pairlink.errors import RemoteError
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from tests.service_peers import wait_for
from tests.test_replicas import Who, replicas
from tests.test_workers import Supervised, two_workers, workdir  # noqa: F401 - fixtures

WHO = "who"
WITHIN = 10.0
"""Seconds a replica may take to be seen stopped, or back (the gateway reconnects with
backoff)."""


@contextlib.asynccontextmanager
async def gateway_over(servers: Sequence[Server]) -> AsyncIterator[Gateway]:
    """A gateway whose route ``who`` names every server as a replica, each seen ready."""
    route = Route(WHO, [server.url for server in servers], WHO)
    config = GatewayConfig(listen="amqp://127.0.0.1:0", routes=(route,))
    async with open_gateway(config) as gateway:
        await wait_for(lambda: states(gateway) == [READY] * len(servers), WITHIN)
        yield gateway


def states(gateway: Gateway) -> list[str]:
    return list(gateway.upstreams[WHO].states())


@contextlib.asynccontextmanager
async def callers(gateway: Gateway, count: int) -> AsyncIterator[list[Client]]:
    """``count`` clients of the gateway, each on a connection of its own."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(connect(gateway.url, timeout=WITHIN))
            for _ in range(count)
        ]


async def names_of(clients: Sequence[Client]) -> list[str]:
    """One call of each client, one after the other: the replica that answered it."""
    return [await client.call(WHO, "name_of") for client in clients]


async def test_new_pairs_spread_over_every_replica() -> None:
    async with (
        replicas(Who("a"), Who("b"), Who("c")) as servers,
        gateway_over(servers) as gateway,
        callers(gateway, 12) as clients,
    ):
        # each caller's pair goes to the replica carrying the fewest pairs, ties in turn
        assert Counter(await names_of(clients)) == {"a": 4, "b": 4, "c": 4}
        # its pair stays there: a caller's calls go where its pair is (link pairing)
        assert await names_of(clients) == await names_of(clients)
        health = await clients[0].call("$health", "check", WHO)
        assert health == {"status": "serving", "replicas": [READY] * 3}


async def test_a_stopped_replica_gets_no_new_pairs_and_is_used_again_once_back() -> None:
    async with (
        replicas(Who("a"), Who("b"), Who("c")) as servers,
        gateway_over(servers) as gateway,
        callers(gateway, 6) as clients,
    ):
        before = await names_of(clients)
        assert Counter(before) == {"a": 2, "b": 2, "c": 2}
        servers[0].stop()  # as on SIGTERM: it drains, detaches its links, closes
        await wait_for(lambda: states(gateway)[0] != READY, WITHIN)
        health = await clients[0].call("$health", "check", WHO)
        assert health["status"] == "serving" and health["replicas"][1:] == [READY] * 2
        # every caller calls again, those of "a" too (their pair went with it): none fails,
        # and the new pairs go to the others, evenly
        after = await names_of(clients)
        assert "a" not in after and Counter(after) == {"b": 3, "c": 3}
        async with open_server(Who("a again"), listen=servers[0].url):
            await wait_for(lambda: states(gateway) == [READY] * 3, WITHIN)
            async with callers(gateway, 3) as newcomers:
                # the replica back carries no pair: it takes the new ones first
                assert await names_of(newcomers) == ["a again"] * 3


@service(WHO, max_concurrency=1, mailbox=1)
class Held:
    """A replica whose calls wait for :attr:`gate`: it drains for as long as the test likes,
    and has room for one call (credit for no other while it holds it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = trio.Event()
        self.started = 0

    @handler
    async def name_of(self) -> str:
        self.started += 1
        await self.gate.wait()
        return self.name


async def test_a_draining_replica_gets_no_new_pairs_and_finishes_its_calls() -> None:
    """Its ``$health`` says ``draining`` while it still holds a call and its links: new pairs
    go to the other replica, and the call it holds is answered."""
    held = Held("a")
    async with (
        open_server(held, listen="amqp://127.0.0.1:0", grace=WITHIN) as draining,
        replicas(Who("b")) as others,
        gateway_over([draining, *others]) as gateway,
        connect(gateway.url, timeout=WITHIN) as first,
    ):
        async with trio.open_nursery() as nursery:
            answers: list[str] = []

            async def call() -> None:
                answers.append(await first.call(WHO, "name_of"))

            nursery.start_soon(call)  # the first pair goes to "a", where it waits
            await wait_for(lambda: held.started == 1)
            draining.stop()
            await wait_for(lambda: states(gateway)[0] == DRAINING, WITHIN)
            async with callers(gateway, 3) as clients:
                assert await names_of(clients) == ["b"] * 3
            held.gate.set()
        assert answers == ["a"]


async def test_a_full_replica_gets_no_new_pair_while_another_has_room() -> None:
    held = Held("a")
    async with (
        open_server(held, listen="amqp://127.0.0.1:0") as full,
        replicas(Who("b")) as others,
        gateway_over([full, *others]) as gateway,
        callers(gateway, 3) as (first, *rest),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(first.call, WHO, "name_of")  # its pair goes to "a", and waits
        await wait_for(lambda: held.started == 1)
        # "a" has one pair, without credit, "b" none, then one with credit: fewest pairs
        # alone would give the third pair to "a" in turn (which refuses it: LP-10)
        assert await names_of(rest) == ["b", "b"]
        assert full.listener is not None
        assert len(full.listener.handlers) == 2  # the gateway's main one, the first's lane
        held.gate.set()


async def test_route_health_is_serving_while_any_replica_is() -> None:
    async with (
        replicas(Who("a"), Who("b")) as servers,
        gateway_over(servers) as gateway,
        connect(gateway.url, timeout=WITHIN) as client,
    ):
        servers[0].stop()
        await wait_for(lambda: states(gateway)[0] != READY, WITHIN)
        health = await client.call("$health", "check", WHO)
        assert health["status"] == "serving" and health["replicas"][1] == READY
        assert await client.call(WHO, "name_of") == "b"
        servers[1].stop()
        await wait_for(lambda: READY not in states(gateway), WITHIN)
        with pytest.raises(RemoteError) as caught:
            await client.call("$health", "check", WHO)
        assert caught.value.status == 503
        assert await client.call("$health", "check") == {"status": "serving"}  # the gateway


async def test_an_unreachable_replica_is_left_for_the_others() -> None:
    """A URL where nothing listens: the route serves on the other one."""
    with trio.socket.socket() as unused:
        await unused.bind(("127.0.0.1", 0))
        nobody = f"amqp://127.0.0.1:{unused.getsockname()[1]}"
        async with replicas(Who("b")) as servers:
            route = Route(WHO, [nobody, servers[0].url], WHO)
            config = GatewayConfig(listen="amqp://127.0.0.1:0", routes=(route,))
            async with (
                open_gateway(config) as gateway,
                callers(gateway, 3) as clients,
            ):
                assert await names_of(clients) == ["b"] * 3
                assert states(gateway) == ["lost", READY]


@service(WHO)
class Local:
    """Answers ``pid`` as the workers of ``tests.test_workers`` do, with a name instead."""

    @handler
    async def pid(self) -> str:
        return "local"


async def test_pairs_on_a_replica_of_several_workers_spread_over_its_workers(
    two_workers: tuple[Supervised, str, dict[int, int]],  # noqa: F811 - the fixture
) -> None:
    """A replica that is ``serve --workers 2`` behind one port: each caller's pairs go on
    connections of its own (its lane), which the kernel spreads over the workers."""
    _served, url, pids = two_workers
    async with open_server(Local(), listen="amqp://127.0.0.1:0") as local:
        route = Route(WHO, [url, local.url], WHO)
        config = GatewayConfig(listen="amqp://127.0.0.1:0", routes=(route,))
        async with open_gateway(config) as gateway:
            await wait_for(lambda: states(gateway) == [READY] * 2, WITHIN)
            async with callers(gateway, 40) as clients:
                answered = Counter([await c.call(WHO, "pid") for c in clients])
    assert answered["local"] == 20  # half the pairs: the fewest-pairs rule
    # the other 20 on 20 lanes to one port: each worker has some (all on one: 2**-19)
    per_worker = [answered[pid] for pid in pids.values()]
    assert sum(per_worker) == 20 and min(per_worker) > 0, per_worker


async def test_a_gateway_behind_a_route_is_not_left_for_a_stopped_service_behind_it() -> None:
    """The next hop is a gateway, which passes on the "shutting down" detach of the service
    behind it: that service comes back, and the route through both gateways serves again."""
    async with replicas(Who("a")) as servers:
        inner = GatewayConfig(
            listen="amqp://127.0.0.1:0", routes=(Route(WHO, servers[0].url, WHO),)
        )
        async with open_gateway(inner) as second:
            outer = GatewayConfig(
                listen="amqp://127.0.0.1:0", routes=(Route(WHO, second.url, WHO),)
            )
            async with open_gateway(outer) as first, connect(first.url, timeout=WITHIN) as client:
                assert await client.call(WHO, "name_of") == "a"
                servers[0].stop()
                await wait_for(lambda: states(second) != [READY], WITHIN)
                async with open_server(Who("a again"), listen=servers[0].url):
                    await wait_for(lambda: states(second) == [READY], WITHIN)
                    assert states(first) == [READY]
                    assert await client.call(WHO, "name_of") == "a again"


async def test_a_replica_that_never_finishes_its_handshake_holds_no_pair_of_the_others() -> None:
    """At start, a replica that accepts the connection and says nothing (its connect waits for
    ``attach_timeout``): the first pairs go to the one that answered, without waiting."""
    accepted = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        accepted.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1")
        )
        mute = f"amqp://127.0.0.1:{listener.socket.getsockname()[1]}"
        async with replicas(Who("b")) as servers:
            route = Route(WHO, [mute, servers[0].url], WHO)
            config = GatewayConfig(listen="amqp://127.0.0.1:0", routes=(route,))
            async with open_gateway(config) as gateway, callers(gateway, 2) as clients:
                with trio.fail_after(config.attach_timeout / 2):
                    assert await names_of(clients) == ["b", "b"]
                assert accepted.is_set() and states(gateway) == ["connecting", READY]
        nursery.cancel_scope.cancel()
