"""A gateway's metrics and health (issue 12 §5): its connections, pairs and each route's next
hop scraped over HTTP after calls relayed to a real server, and ``$health`` answered by the
gateway itself, for ``pairlink health`` and orchestrators; all over TCP on 127.0.0.1."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import trio

from pairlink import connect, open_server
from pairlink._client.health import SERVING, check_health
from pairlink._gateway.config import MAX_PAIRS, parse_config
from pairlink._io.net import AmqpUrl
from pairlink._server.serving import Server
from pairlink.errors import ConfigError, RemoteError
from pairlink.gateway import Gateway, GatewayConfig, Route, open_gateway
from services.echo import Echo
from tests.scraping import scrape
from tests.service_peers import wait_for
from tests.test_client_cli import Served

URL = "amqp://127.0.0.1:0"
PUBLIC = "echo-public"
WITHIN = 20


async def _serve_until(stop: trio.Event, *, task_status: trio.TaskStatus[Server]) -> None:
    async with open_server(Echo, listen=URL, metrics_listen="127.0.0.1:0") as server:
        task_status.started(server)
        await stop.wait()


def _config(
    upstream: str, *, metrics_listen: str | None = None, max_pairs: int = MAX_PAIRS
) -> GatewayConfig:
    route = Route(public=PUBLIC, upstream=upstream, address="echo")
    return GatewayConfig(
        listen=URL, routes=(route,), metrics_listen=metrics_listen, max_pairs=max_pairs
    )


async def _connected(gateway: Gateway) -> None:
    (upstream,) = gateway.upstreams[PUBLIC].upstreams
    await upstream.tried.wait()
    assert upstream.up


async def test_gateway_metrics_after_relayed_calls() -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(_serve_until, stop)
        config = _config(server.url, metrics_listen="127.0.0.1:0")
        async with open_gateway(config) as gateway:
            await _connected(gateway)
            assert gateway.metrics_url is not None and server.metrics_url is not None
            async with connect(gateway.url) as client:
                for n in range(3):
                    assert await client.call(PUBLIC, "echo", n) == n
                got = await scrape(gateway.metrics_url)
                assert got.value("pairlink_connections") == 1
                assert got.value("pairlink_gateway_pairs") == 1  # the client's one pair
                assert got.value("pairlink_gateway_pairs_max") == MAX_PAIRS
                hop = AmqpUrl.parse(server.url)
                labels = {"route": PUBLIC, "upstream": f"{hop.host}:{hop.port}"}
                assert got.value("pairlink_gateway_upstream_connected", **labels) == 1
                # the server behind it counted the relayed calls as its own
                behind = await scrape(server.metrics_url)
                calls = {"service": "echo", "operation": "echo", "status": "200"}
                assert behind.value("pairlink_calls_total", **calls) == 3
                # the gateway's upstream connections: its main one and the client's lane
                assert behind.value("pairlink_connections") == 2
            await wait_for(lambda: gateway.pairs.used == 0)
            stop.set()  # the next hop goes away
            await wait_for(lambda: not gateway.upstreams[PUBLIC].up, WITHIN)
            got = await scrape(gateway.metrics_url)
            assert got.value("pairlink_gateway_upstream_connected", **labels) == 0
            assert got.value("pairlink_gateway_pairs") == 0
            assert got.value("pairlink_connections") == 0


async def test_a_gateway_without_metrics_has_no_registry() -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(_serve_until, stop)
        async with open_gateway(_config(server.url)) as gateway:
            assert gateway.metrics is None and gateway.metrics_url is None
        stop.set()


async def _health_cli(*args: str) -> tuple[int, str, str]:
    argv = [sys.executable, "-m", "pairlink", "health", *args]
    with trio.fail_after(WITHIN):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_gateway_answers_health_itself() -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(_serve_until, stop)
        async with open_gateway(_config(server.url)) as gateway:
            await _connected(gateway)
            assert await _health_cli(gateway.url) == (0, "serving\n", "")
            assert await _health_cli(gateway.url, "--service", PUBLIC) == (0, "serving\n", "")
            code, out, err = await _health_cli(gateway.url, "--service", "nope")
            assert (code, out) == (1, "")
            assert "404" in err and "nope" in err
            async with connect(gateway.url) as client:
                with pytest.raises(RemoteError) as caught:
                    await client.call("$health", "status")
                assert caught.value.status == 404
                assert await client.call("$health", "check", service=PUBLIC) == {"status": SERVING}
            stop.set()  # the route's next hop goes away: the gateway is up, the route is not
            await wait_for(lambda: not gateway.upstreams[PUBLIC].up, WITHIN)
            assert await check_health(gateway.url) == SERVING
            code, out, err = await _health_cli(gateway.url, "--service", PUBLIC)
            assert (code, out) == (1, "")
            assert "503" in err and "unreachable" in err


async def test_health_pairs_take_no_place_in_max_pairs() -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(_serve_until, stop)
        async with open_gateway(_config(server.url, max_pairs=1)) as gateway:
            await _connected(gateway)
            async with connect(gateway.url) as client:
                assert await client.call("$health", "check") == {"status": SERVING}
                assert gateway.pairs.used == 0
                assert await client.call(PUBLIC, "echo", 1) == 1  # the one place is free
                assert gateway.pairs.used == 1
        stop.set()


def test_gateway_metrics_listen_on_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        'listen = "amqp://127.0.0.1:0"\nmax_pairs = 7\n'
        '[[route]]\npublic = "a"\nupstream = "amqp://127.0.0.1:9"\naddress = "b"\n'
    )
    args = ("--config", str(config), "--metrics-listen", "127.0.0.1:0")
    with Served(*args, command="gateway") as served:
        match = re.search(
            r"(http://127\.0\.0\.1:\d+/metrics)", served.wait_for("metrics.listening")
        )
        assert match is not None
        got = trio.run(scrape, match.group(1))
        assert got.value("pairlink_gateway_pairs_max") == 7
        labels = {"route": "a", "upstream": "127.0.0.1:9"}
        assert got.value("pairlink_gateway_upstream_connected", **labels) == 0  # port 9: closed
        assert served.interrupt() == 0


GATEWAY = (
    'listen = "amqp://h"\n{extra}[[route]]\npublic = "{public}"\nupstream = "amqp://h"\n'
    'address = "b"\n'
)


def test_metrics_listen_in_the_gateway_config() -> None:
    text = GATEWAY.format(extra='metrics_listen = "127.0.0.1:9464"\n', public="a")
    assert parse_config(text).metrics_listen == "127.0.0.1:9464"
    assert parse_config(GATEWAY.format(extra="", public="a")).metrics_listen is None


@pytest.mark.parametrize(
    ("extra", "public", "problem"),
    [
        (
            'metrics_listen = "9464"\n',
            "a",
            "<config>:2: metrics_listen: '9464' is not HOST:PORT",
        ),
        ("metrics_listen = 9464\n", "a", "<config>:2: metrics_listen: expected a string"),
        ("", "$health", "<config>:3: route[1].public: '$health' is the gateway's own health node"),
    ],
)
def test_gateway_config_mistakes(extra: str, public: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(GATEWAY.format(extra=extra, public=public))
    assert str(caught.value).startswith(problem)
