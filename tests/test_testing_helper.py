"""pairlink.testing: services called through the real container, engine and client over
in-memory streams, with no socket, so that Trio's autojump clock drives their time."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from pairlink import (
    ConnectionLostError,
    LinkDetachedError,
    RemoteError,
    handler,
    open_server,
    remote,
    service,
)
from pairlink._io.listener import IN_MEMORY_URL
from pairlink.testing import connect_in_memory, serve_in_memory


@service("calc")
class Calculator:
    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

    @handler
    async def later(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return f"after {seconds} s"


@service("front")
class Front:
    """Calls another service of its server with ``remote()``."""

    @handler
    async def double_sum(self, a: int, b: int) -> int:
        calc = await remote("calc")
        return 2 * int(await calc.add(a, b))


async def test_a_call_goes_through_a_server_without_a_socket() -> None:
    async with open_server(Calculator, listen=None) as server:
        assert (server.url, server.port) == (IN_MEMORY_URL, 0)
        async with connect_in_memory(server) as client:
            calc = await client.service("calc")
            assert await calc.add(1, 2) == 3
            assert client.paired  # the listener's open, capabilities and all
            assert server.listener is not None
            (conn,) = server.listener.connections
            assert conn.peer.startswith("memory-")


async def test_serve_in_memory_is_the_short_form() -> None:
    async with serve_in_memory(Calculator) as client:
        assert await (await client.service("calc")).add(1, 2) == 3


async def test_an_unknown_operation_is_a_404() -> None:
    async with serve_in_memory(Calculator) as client:
        with pytest.raises(RemoteError) as caught:
            await client.call("calc", "sub", 3, 1)
        assert caught.value.status == 404


async def test_an_unknown_address_is_refused() -> None:
    async with serve_in_memory(Calculator) as client:
        with pytest.raises(LinkDetachedError):
            await client.call("nowhere", "add", 1, 2)


async def test_time_is_the_autojump_clock(autojump_clock: trio.testing.MockClock) -> None:
    """No real I/O, so the clock jumps as soon as every task waits: a minute's handler and
    a timed-out hour pass at once, the deadline travelling as on any connection."""
    real_start = time.monotonic()
    async with serve_in_memory(Calculator) as client:
        start = trio.current_time()
        assert await client.call("calc", "later", 60, timeout=120) == "after 60 s"
        assert trio.current_time() - start == pytest.approx(60)
        with pytest.raises(TimeoutError):
            await client.call("calc", "later", 3600, timeout=5)
        assert trio.current_time() - start == pytest.approx(65)
    assert time.monotonic() - real_start < 10


async def test_two_services_and_remote_between_them() -> None:
    async with serve_in_memory(Calculator, Front) as client:
        front = await client.service("front")
        assert await front.double_sum(2, 3) == 10
        assert await (await client.service("calc")).add(4, 5) == 9


async def test_each_connection_gets_its_own_streams() -> None:
    """Two clients, and a reconnect after the server drops one: a new in-memory pair each."""
    async with (
        open_server(Calculator, listen=None) as server,
        connect_in_memory(server, reconnect=True) as first,
        connect_in_memory(server, reconnect=False) as second,
    ):
        assert server.listener is not None
        assert await first.call("calc", "add", 1, 1) == 2
        assert await second.call("calc", "add", 2, 2) == 4
        peers = {conn.peer for conn in server.listener.connections}
        assert len(peers) == 2
        for conn in list(server.listener.connections):
            conn.abort(ConnectionLostError("dropped by the test"))
        await first.wait_connection_lost()
        await second.wait_connection_lost()
        assert await first.call("calc", "add", 3, 3) == 6  # reconnected
        with pytest.raises(ConnectionLostError):
            await second.call("calc", "add", 4, 4)
        (again,) = server.listener.connections
        assert again.peer not in peers


async def test_a_socket_server_takes_in_memory_clients_too() -> None:
    async with (
        open_server(Calculator, listen="amqp://127.0.0.1:0") as server,
        connect_in_memory(server) as client,
    ):
        assert server.port != 0
        assert await client.call("calc", "add", 20, 22) == 42
        assert server.listener is not None
        (conn,) = server.listener.connections
        assert conn.peer.startswith("memory-")


async def test_a_stopped_server_refuses_new_connections() -> None:
    async with open_server(Calculator, listen=None) as server:
        pass
    with pytest.raises(ConnectionLostError, match="the listener has closed"):
        async with connect_in_memory(server):
            pass
