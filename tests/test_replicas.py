"""A client with several replicas, against servers of this process over real TCP: a list of
URLs, a host name with several addresses (Trio's custom hostname resolver maps a made-up name
to loopback addresses, each served on the same port), balance by credit, and a replica that
drains or goes away."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from pairlink import connect, handler, open_server, service
from pairlink._client.placement import DRAINING, LOST, READY, Rotation
from pairlink._server.serving import Server
from pairlink.errors import ConnectionLostError
from tests.service_peers import wait_for


@service("who", max_concurrency=8)
class Who:
    """Says which replica answered; ``slow`` waits first, as a replica with less room does."""

    def __init__(self, name: str, delay: float = 0.0) -> None:
        self.name = name
        self.delay = delay
        self.started = 0

    @handler
    async def name_of(self) -> str:
        self.started += 1
        if self.delay:
            await trio.sleep(self.delay)
        return self.name


@contextlib.asynccontextmanager
async def replicas(*services: Who, host: str = "127.0.0.1") -> AsyncIterator[list[Server]]:
    """One server per service, each on a port of its own."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(open_server(s, listen=f"amqp://{host}:0"))
            for s in services
        ]
        yield servers


class Names(trio.abc.HostnameResolver):
    """Resolves ``names`` (made up) to loopback addresses; ``addresses`` may change."""

    def __init__(self, name: str, addresses: Sequence[str]) -> None:
        self.name = name
        self.addresses = list(addresses)
        self.lookups = 0

    async def getaddrinfo(  # type: ignore[override]
        self, host: bytes | str, port: bytes | str | int | None, *_args: Any, **_kwargs: Any
    ) -> list[tuple[Any, ...]]:
        host = host.decode() if isinstance(host, bytes) else host
        assert host == self.name, host  # nothing else is looked up in these tests
        self.lookups += 1
        port = int(port or 0)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, port))
            for a in self.addresses
        ]

    async def getnameinfo(self, *_args: Any) -> tuple[str, str]:
        raise NotImplementedError


@contextlib.contextmanager
def resolving(names: Names) -> Any:
    previous = trio.socket.set_custom_hostname_resolver(names)
    try:
        yield names
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


def test_ties_rotate_and_the_most_free_credit_wins() -> None:
    rotation = Rotation()
    credit = {"a": 3, "b": 3, "c": 1}
    assert [rotation.pick(["a", "b", "c"], credit.__getitem__) for _ in range(4)] == [
        "a",
        "b",
        "a",
        "b",
    ]
    credit["c"] = 5
    assert rotation.pick(["a", "b", "c"], credit.__getitem__) == "c"
    assert rotation.pick([], credit.__getitem__) is None


async def test_a_list_of_urls_spreads_calls_over_every_replica() -> None:
    async with (
        replicas(Who("a"), Who("b"), Who("c")) as servers,
        connect([s.url for s in servers], timeout=10) as client,
    ):
        await wait_for(lambda: [r.state for r in client.replicas] == [READY] * 3)
        who = await client.service("who")
        names = Counter([await who.name_of() for _ in range(30)])
        assert names == {"a": 10, "b": 10, "c": 10}  # one at a time: ties rotate
        got = [r.url for r in client.replicas]
        assert got == [s.url for s in servers]
        assert {r.state for r in client.replicas} == {READY}
        assert all(r.free_credit > 0 and r.in_flight == 0 for r in client.replicas)


async def test_a_slow_replica_gets_fewer_calls() -> None:
    async with (
        replicas(Who("fast"), Who("slow", delay=0.05)) as servers,
        connect([s.url for s in servers], timeout=30) as client,
    ):
        await wait_for(lambda: [r.state for r in client.replicas] == [READY] * 2)
        who = await client.service("who")
        names: Counter[str] = Counter()

        async def caller() -> None:
            for _ in range(20):
                names[await who.name_of()] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(24):  # more than both mailboxes (8 each) hold
                nursery.start_soon(caller)
        assert names["fast"] + names["slow"] == 480
        assert names["slow"] < names["fast"] / 3, names


async def test_a_name_with_several_addresses_is_one_replica_per_address() -> None:
    addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    async with open_server(Who("1"), listen="amqp://127.0.0.1:0") as first:
        port = first.listener.port if first.listener else 0
        async with contextlib.AsyncExitStack() as stack:
            for n, address in enumerate(addresses[1:], start=2):
                url = f"amqp://{address}:{port}"
                await stack.enter_async_context(open_server(Who(str(n)), listen=url))
            names = Names("svc.replicas.test", addresses[:2])
            with resolving(names):
                url = f"amqp://svc.replicas.test:{port}"
                async with connect(url, timeout=10, resolve_interval=0.05) as client:
                    assert [r.address for r in client.replicas] == addresses[:2]
                    await wait_for(lambda: [r.state for r in client.replicas] == [READY] * 2)
                    who = await client.service("who")
                    assert Counter([await who.name_of() for _ in range(4)]) == {"1": 2, "2": 2}
                    names.addresses = addresses[1:]  # one more, one gone: resolved again
                    await wait_for(
                        lambda: (
                            [r.address for r in client.replicas if r.state == READY]
                            == addresses[1:]
                        )
                    )
                    got = Counter([await who.name_of() for _ in range(4)])
                    assert got == {"2": 2, "3": 2}


async def test_one_name_of_one_address_is_one_connection_as_before() -> None:
    async with open_server(Who("only"), listen="amqp://127.0.0.1:0") as server:
        port = server.listener.port if server.listener else 0
        with resolving(Names("one.replicas.test", ["127.0.0.1"])) as names:
            async with connect(f"amqp://one.replicas.test:{port}", timeout=10) as client:
                assert await client.call("who", "name_of") == "only"
                assert [(r.address, r.state) for r in client.replicas] == [(None, READY)]
            assert names.lookups == 2  # the check for replicas, then the connection's own


async def test_a_draining_replica_gets_no_new_calls_and_loses_none() -> None:
    async with (
        replicas(Who("a", delay=0.01), Who("b", delay=0.01)) as servers,
        connect([s.url for s in servers], timeout=10, max_retry_delay=0.1) as client,
    ):
        await wait_for(lambda: [r.state for r in client.replicas] == [READY] * 2)
        who = await client.service("who")
        seen_draining = trio.Event()
        done = trio.Event()
        after: Counter[str] = Counter()  # answers to calls made once "a" was seen draining
        calls = 0

        async def caller() -> None:
            nonlocal calls
            while not done.is_set():
                late = seen_draining.is_set()
                name = await who.name_of()  # any failure fails the test
                calls += 1
                if late:
                    after[name] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(caller)
            await wait_for(lambda: calls >= 50)
            servers[0].stop()
            await wait_for(lambda: client.replicas[0].state in (DRAINING, LOST))
            seen_draining.set()
            await wait_for(lambda: after["b"] >= 50)
            done.set()
        assert after["a"] == 0


async def test_calls_in_flight_on_a_lost_replica_fail_and_the_rest_go_on() -> None:
    async with (
        replicas(slow := Who("a", delay=0.5), Who("b")) as servers,
        connect([s.url for s in servers], timeout=10, reconnect=False) as client,
    ):
        who = await client.service("who")
        failed: list[BaseException] = []
        answered: Counter[str] = Counter()

        async def caller() -> None:
            try:
                answered[await who.name_of()] += 1
            except ConnectionLostError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(caller)
            await wait_for(lambda: slow.started == 2)  # both sent, running
            assert servers[0].listener is not None
            for conn in list(servers[0].listener.handlers):
                conn.abort(ConnectionLostError("the test cuts it"))
        assert len(failed) == 2
        await wait_for(lambda: client.replicas[0].state == LOST)
        assert await who.name_of() == "b"  # the next call goes to the one left


@service("tight", max_concurrency=2, mailbox=2)
class Tight:
    """Room for two calls: the rest wait in the caller's line for its credit."""

    def __init__(self) -> None:
        self.started = 0

    @handler
    async def wait(self) -> int:
        self.started += 1
        await trio.sleep(0.2)
        return self.started


async def test_calls_waiting_for_a_lost_replicas_credit_go_to_another() -> None:
    lost, kept = Tight(), Tight()
    async with (
        open_server(lost, listen="amqp://127.0.0.1:0") as first,
        open_server(kept, listen="amqp://127.0.0.1:0") as second,
        connect([first.url, second.url], timeout=10, reconnect=False) as client,
    ):
        await wait_for(lambda: [r.state for r in client.replicas] == [READY] * 2)
        failed: list[BaseException] = []
        answered = 0

        async def caller() -> None:
            nonlocal answered
            try:
                await client.call("tight", "wait")
            except ConnectionLostError as exc:
                failed.append(exc)
            else:
                answered += 1

        async with trio.open_nursery() as nursery:
            for _ in range(8):  # 2 running on each, the others in the two lines
                nursery.start_soon(caller)
            await wait_for(lambda: lost.started == 2 and client.replicas[0].in_flight == 4)
            assert first.listener is not None
            for conn in list(first.listener.handlers):
                conn.abort(ConnectionLostError("the test cuts it"))
        assert len(failed) == 2  # the two it was running
        assert answered == 6 and kept.started == 6  # its line went to the other


async def test_one_url_is_one_replica() -> None:
    async with replicas(Who("a")) as servers, connect(servers[0].url, timeout=10) as client:
        assert await client.call("who", "name_of") == "a"
        [replica] = client.replicas
        assert (replica.url, replica.address, replica.state) == (servers[0].url, None, READY)
        assert replica.in_flight == 0
