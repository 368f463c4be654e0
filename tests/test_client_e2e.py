"""Our client against our own services, over real TCP on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from pairlink import connect, handler, open_server, remote, service
from pairlink._client import blocking
from pairlink._rpc import deadline
from pairlink._server.serving import Server
from pairlink.errors import ConnectionLostError, RemoteError
from pairlink.spark import serve_in_thread
from services.echo import Echo
from tests.service_peers import wait_for


@service("probe", max_concurrency=8)
class Probe:
    """What a served call sees of its own deadline."""

    @handler
    async def remaining(self) -> float | None:
        return deadline.remaining()


@service("front", max_concurrency=8)
class Front:
    """Calls another service from inside a handler (actor to actor)."""

    @handler
    async def inner_remaining(self) -> float | None:
        probe = await remote("probe")
        return await probe.remaining()  # type: ignore[no-any-return]

    @handler(expose_errors=ZeroDivisionError)
    async def divide(self, a: float, b: float) -> float:
        return a / b


@asynccontextmanager
async def served(*services: Any) -> AsyncIterator[Server]:
    async with open_server(*services, listen="amqp://127.0.0.1:0") as server:
        yield server


async def test_echo_round_trips_any_value_over_a_pair() -> None:
    values: list[Any] = [None, 1, -2.5, "héllo", b"\x00\xff", [1, [2]], {"k": {"n": None}}]
    values.append(b"x" * (1 << 20))  # spans many transfer frames both ways
    async with served(Echo) as server, connect(server.url, timeout=10) as client:
        echo = await client.service("echo")
        for value in values:
            assert await echo.echo(value) == value
        assert await echo.call("echo", x="by keyword") == "by keyword"
        assert client.paired


@pytest.mark.timeout(120)
async def test_load_50_clients_200_calls_each_every_reply_its_own() -> None:
    """Each call carries a value no other call carries; every one must come back exactly
    once, to the caller that sent it."""
    clients, calls = 50, 200
    got: list[tuple[int, int, Any]] = []
    async with served(Echo) as server:

        async def one_client(c: int) -> None:
            async with connect(server.url, timeout=60) as client:
                echo = await client.service("echo")
                async with trio.open_nursery() as nursery:
                    for i in range(calls):

                        async def one(i: int = i) -> None:
                            got.append((c, i, await echo.echo([c, i])))

                        nursery.start_soon(one)

        async with trio.open_nursery() as nursery:
            for c in range(clients):
                nursery.start_soon(one_client, c)
    assert len(got) == clients * calls
    assert all(reply == [c, i] for c, i, reply in got)
    assert len({(c, i) for c, i, _ in got}) == clients * calls  # none lost, none twice


async def test_deadline_travels_from_actor_to_actor(io_clock: trio.testing.MockClock) -> None:
    """The caller gives 2 s; the inner call, made by the handler with no timeout of its
    own (its client's default is 30 s), gets what is left of those 2 s: on a clock that
    stands still, all of it (to the millisecond of the wire's two hops)."""
    async with served(Front, Probe) as server, connect(server.url) as client:
        left = await client.call("front", "inner_remaining", timeout=2)
        assert left == pytest.approx(2.0, abs=0.003)
        unbounded = await client.call("probe", "remaining", timeout=float("inf"))
        assert unbounded is None


async def test_handler_error_and_unknown_operation() -> None:
    async with served(Front, Probe) as server, connect(server.url, timeout=5) as client:
        front = await client.service("front")
        with pytest.raises(RemoteError) as exc:
            await front.divide(1, 0)
        assert (exc.value.status, exc.value.type) == (500, "ZeroDivisionError")
        with pytest.raises(RemoteError) as exc:
            await front.missing()
        assert exc.value.status == 404
        assert await front.divide(1, 4) == 0.25


async def test_slow_handler_beyond_the_timeout(io_clock: trio.testing.MockClock) -> None:
    async with served(Echo) as server, connect(server.url, timeout=5) as client:
        echo = await client.service("echo")
        start = trio.current_time()
        with pytest.raises(TimeoutError):
            await echo.options(timeout=0.3).sleep(2)
        assert trio.current_time() - start == pytest.approx(0.3)
        assert await echo.echo("still serving") == "still serving"


async def test_unsettled_requests_against_our_service() -> None:
    async with served(Echo) as server, connect(server.url, timeout=5, settled=False) as client:
        echo = await client.service("echo")
        assert [await echo.echo(i) for i in range(5)] == list(range(5))


class Relay:
    """A TCP relay in front of a server, whose connections the test can cut at once (the
    server goes on running, as after a network failure between the two)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._cuts: list[trio.CancelScope] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    def cut(self) -> None:
        for scope in self._cuts:
            scope.cancel()
        self._cuts.clear()

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        with trio.CancelScope() as scope:
            self._cuts.append(scope)
            async with client, upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, client, upstream)
                nursery.start_soon(self._pipe, upstream, client)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(upstream)

    @staticmethod
    async def _pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def test_connection_cut_mid_call_fails_the_calls_then_reconnects(
    io_clock: trio.testing.MockClock,
) -> None:
    async with served(Echo) as server, trio.open_nursery() as nursery:
        relay = Relay(server.port)
        await nursery.start(relay.run)
        url = f"amqp://127.0.0.1:{relay.port}"
        async with connect(url, timeout=10, reconnect=True, retry_delay=0.05) as client:
            echo = await client.service("echo")
            assert await echo.echo(1) == 1
            failures: list[BaseException] = []

            async def slow() -> None:
                try:  # the service ends the handlers at this deadline: it has no one to answer
                    await echo.options(timeout=1.5).sleep(5)
                except ConnectionLostError as exc:
                    failures.append(exc)

            async with trio.open_nursery() as calls:
                for _ in range(5):
                    calls.start_soon(slow)
                await wait_for(lambda: server.actors["echo"].running == 5)  # in its hands
                cut_at = trio.current_time()
                relay.cut()
            assert len(failures) == 5
            assert trio.current_time() - cut_at < 1  # at once, not at the 1.5 s deadline
            await client.wait_connection_lost()
            assert await echo.echo(2) == 2  # a new connection, a new pair
            assert relay.connections == 2
        assert await _still_serving(server)
        nursery.cancel_scope.cancel()


async def _still_serving(server: Server) -> bool:
    async with connect(server.url, timeout=5) as client:
        return await client.call("echo", "echo", True) is True


def test_blocking_client_against_our_service() -> None:
    """Our server runs in a Trio thread of its own; the blocking client has another."""
    up = threading.Event()
    box: dict[str, Any] = {}

    async def run_server() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = stop = trio.Event()
        async with served(Echo) as server:
            box["url"] = server.url
            up.set()
            await stop.wait()

    thread = threading.Thread(target=trio.run, args=(run_server,), daemon=True)
    thread.start()
    assert up.wait(10)
    try:
        with blocking.connect(box["url"], timeout=5) as client:
            echo = client.service("echo")
            assert [echo.echo(i) for i in range(10)] == list(range(10))
            with pytest.raises(TimeoutError):
                echo.options(timeout=0.1).sleep(1)
    finally:
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(10)


# -- reconnection by default -----------------------------------------------------------------


async def _free_port() -> int:
    """A port nothing listens on now (bound to port 0, then let go): a server's, to restart on."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port: int = listener.socket.getsockname()[1]
    await listener.aclose()
    return port


async def _serve_until(
    url: str, stop: trio.Event, *, task_status: trio.TaskStatus[trio.Event]
) -> None:
    """Serve Echo at ``url`` until ``stop``; started with the event set once it has stopped."""
    stopped = trio.Event()
    try:
        async with open_server(Echo, listen=url, grace=1):
            task_status.started(stopped)
            await stop.wait()
    finally:
        stopped.set()


@pytest.mark.parametrize("by_default", [True, False], ids=["default", "reconnect-off"])
async def test_a_server_restarted_on_its_port_is_called_again_by_default(
    by_default: bool,
) -> None:
    url = f"amqp://127.0.0.1:{await _free_port()}"
    first, second = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        stopped = await nursery.start(_serve_until, url, first)
        client_context = (
            connect(url, timeout=10, retry_delay=0.05)
            if by_default
            else connect(url, timeout=10, retry_delay=0.05, reconnect=False)
        )
        async with client_context as client:
            echo = await client.service("echo")
            assert await echo.echo(1) == 1
            first.set()  # the server stops, closing its connections
            await stopped.wait()
            await client.wait_connection_lost()
            await nursery.start(_serve_until, url, second)  # on the same port
            if by_default:
                assert await echo.echo(2) == 2  # the same client, the same proxy
            else:
                with pytest.raises(ConnectionLostError):
                    await echo.echo(2)
        second.set()


# -- options travel apart from the operation's keywords ------------------------------------


@service("keywords", dedup_window=60)
class Keywords:
    """An operation whose parameters bear the names of call options."""

    def __init__(self) -> None:
        self.runs = 0

    @handler
    async def kw(
        self,
        x: int,
        timeout: float | None = None,  # noqa: ASYNC109 - an ordinary parameter here
        encoding: str | None = None,
        message_id: str | None = None,
        kwargs: dict[str, int] | None = None,
    ) -> list[Any]:
        self.runs += 1
        return [x, timeout, encoding, message_id, kwargs]


NAMED_LIKE_OPTIONS = {"timeout": 5, "encoding": "utf-8", "message_id": "m-1"}


async def test_a_proxy_passes_every_keyword_to_the_operation() -> None:
    served_keywords = Keywords()
    async with served(served_keywords) as server, connect(server.url, timeout=5) as client:
        proxy = await client.service("keywords")
        assert await proxy.kw(1, **NAMED_LIKE_OPTIONS) == [1, 5, "utf-8", "m-1", None]
        assert await proxy.call("kw", 2, **NAMED_LIKE_OPTIONS, kwargs={"a": 1}) == [
            2, 5, "utf-8", "m-1", {"a": 1}
        ]  # fmt: skip
        # Client.call: its own keywords are options, the kwargs mapping the operation's
        assert await client.call("keywords", "kw", 3, timeout=5) == [3, None, None, None, None]
        got = await client.call("keywords", "kw", 4, kwargs={**NAMED_LIKE_OPTIONS, "kwargs": {}})
        assert got == [4, 5, "utf-8", "m-1", {}]
        with pytest.raises(TypeError, match="given twice: x"):
            await client.call("keywords", "kw", kwargs={"x": 1}, x=2)
        # the options go on a copy of the proxy: a timeout, a message-id that dedup recognises
        with pytest.raises(TimeoutError):
            await proxy.options(timeout=0).kw(5)
        once = proxy.options(message_id="same")
        runs = served_keywords.runs
        assert [await once.kw(6) for _ in range(2)] == [[6, None, None, None, None]] * 2
        assert served_keywords.runs == runs + 1  # the repeat was answered from the stored reply
        assert await proxy.kw(7) == [7, None, None, None, None]  # the original is unchanged


def test_a_blocking_proxy_passes_every_keyword_to_the_operation() -> None:
    with (
        serve_in_thread(Keywords(), listen="amqp://127.0.0.1:0") as server,
        blocking.connect(server.url, timeout=5) as client,
    ):
        proxy = client.service("keywords", timeout=5)
        assert proxy.kw(1, **NAMED_LIKE_OPTIONS) == [1, 5, "utf-8", "m-1", None]
        assert proxy.options(timeout=3).call("kw", 2, timeout=4) == [2, 4, None, None, None]
        got = client.call("keywords", "kw", 3, kwargs=NAMED_LIKE_OPTIONS, timeout=5)
        assert got == [3, 5, "utf-8", "m-1", None]
