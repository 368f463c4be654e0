"""Prometheus metrics of a server (issue 12 §5): calls by service, operation and status,
latency histograms, and the gauges read at each scrape; scraped over HTTP from a real server
on 127.0.0.1, after known calls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest

from pairlink import handler, open_server, service
from pairlink._client import blocking
from pairlink._client.client import connect
from pairlink._client.health import HEALTH
from pairlink._rpc import wire
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.payload import Encoding
from pairlink._server.metrics import UNKNOWN_OPERATION
from pairlink._telemetry.metrics import parse_listen
from pairlink.errors import CallError, MetricsUnavailable, RemoteError
from tests.scraping import Scrape, http_get, scrape
from tests.service_peers import wait_for
from tests.test_client_cli import Served

URL = "amqp://127.0.0.1:0"
METRICS = "127.0.0.1:0"


@service("calc", max_concurrency=1, mailbox=4)
class Calc:
    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = trio.Event()

    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

    @handler
    async def conflict(self) -> None:
        raise CallError(409, "already there")

    @handler
    async def hold(self) -> str:
        self.started.set()
        await self.release.wait()
        return "done"


async def test_calls_are_counted_by_service_operation_and_status() -> None:
    async with (
        open_server(Calc, listen=URL, metrics_listen=METRICS) as server,
        connect(server.url) as client,
    ):
        for n in range(3):
            assert await client.call("calc", "add", n, 1) == n + 1
        with pytest.raises(RemoteError, match="409"):
            await client.call("calc", "conflict")
        with pytest.raises(RemoteError, match="404"):
            await client.call("calc", "no-such-operation")
        late = wire.request_message(  # its deadline passed before it was sent: 408
            "add", [1, 2], {}, message_id=None, now=wall_time() - 60, timeout=1.0,
            encoding=Encoding.AMQP_VALUE,
        )  # fmt: skip
        assert (await client.request("calc", late)).status == 408
        await client.call(HEALTH, "check")
        assert server.metrics_url is not None
        got = await scrape(server.metrics_url)

    def calls(operation: str, status: int) -> float | None:
        labels = {"service": "calc", "operation": operation, "status": str(status)}
        return got.value("pairlink_calls_total", **labels)

    assert calls("add", 200) == 3
    assert calls("add", 408) == 1
    assert calls("conflict", 409) == 1
    assert calls(UNKNOWN_OPERATION, 404) == 1  # the caller's name for it is not a label
    assert calls("no-such-operation", 404) is None
    assert calls("hold", 200) is None  # never called: no sample
    labels = {"service": HEALTH, "operation": "check", "status": "200"}
    assert got.value("pairlink_calls_total", **labels) == 1
    count = "pairlink_call_duration_seconds_count"
    assert got.value(count, service="calc", operation="add") == 4  # every answer is timed
    assert got.value(count, service="calc", operation="conflict") == 1
    assert got.value(count, service="calc", operation=UNKNOWN_OPERATION) == 1
    total = got.value("pairlink_call_duration_seconds_sum", service="calc", operation="add")
    assert total is not None and 0 < total < 10
    bucket = "pairlink_call_duration_seconds_bucket"
    assert got.value(bucket, service="calc", operation="add", le="+Inf") == 4


async def test_gauges_show_what_each_service_holds_now() -> None:
    calc = Calc()
    async with (
        open_server(calc, listen=URL, metrics_listen=METRICS) as server,
        connect(server.url) as client,
        trio.open_nursery() as nursery,
    ):
        assert server.metrics_url is not None
        assert await client.call("calc", "add", 1, 2) == 3  # the client's pair is attached
        actor = server.actors["calc"]
        await wait_for(lambda: actor.held == 0 and actor.outstanding > 0)  # granted again
        before = await scrape(server.metrics_url)
        assert before.value("pairlink_connections") == 1
        assert before.value("pairlink_calls_running", service="calc") == 0
        assert before.value("pairlink_mailbox_size", service="calc") == 4
        credit = before.value("pairlink_credit_outstanding", service="calc")
        assert credit == actor.outstanding  # (nothing was sent since)

        results: list[str] = []

        async def hold() -> None:
            results.append(await client.call("calc", "hold"))

        nursery.start_soon(hold)
        await calc.started.wait()
        nursery.start_soon(hold)  # max_concurrency=1: this one waits in the mailbox
        await wait_for(lambda: actor.queued == 1)  # read and queued
        during = await scrape(server.metrics_url)
        assert during.value("pairlink_calls_running", service="calc") == 1
        assert during.value("pairlink_calls_queued", service="calc") == 1
        assert during.value("pairlink_mailbox_held", service="calc") == 2
        outstanding = during.value("pairlink_credit_outstanding", service="calc")
        assert outstanding is not None and outstanding <= 2  # never more than the free slots
        calc.release.set()
        await wait_for(lambda: len(results) == 2)
        after = await scrape(server.metrics_url)
        assert after.value("pairlink_calls_running", service="calc") == 0
        assert after.value("pairlink_calls_queued", service="calc") == 0
        labels = {"service": "calc", "operation": "hold", "status": "200"}
        assert after.value("pairlink_calls_total", **labels) == 2


async def test_a_call_cut_short_by_the_stop_counts_as_503() -> None:
    calc = Calc()
    async with (
        trio.open_nursery() as nursery,
        open_server(calc, listen=URL, metrics_listen=METRICS, grace=0) as server,
    ):
        nursery.start_soon(_call_hold, server.url)
        await calc.started.wait()
        # leaving the server's block stops it, the grace of 0 s cutting the call short
    assert server.metrics is not None
    got = Scrape(generate_latest(server.metrics.registry).decode())
    labels = {"service": "calc", "operation": "hold", "status": "503"}
    assert got.value("pairlink_calls_total", **labels) == 1


async def _call_hold(url: str) -> None:
    async with connect(url) as client:
        with pytest.raises(RemoteError, match="503"):
            await client.call("calc", "hold")


async def test_each_server_has_its_own_registry() -> None:
    async with (
        open_server(Calc, listen=URL, metrics_listen=METRICS) as busy,
        open_server(Calc, listen=URL, metrics_listen=METRICS) as idle,
        connect(busy.url) as client,
    ):
        await client.call("calc", "add", 1, 2)
        assert busy.metrics_url is not None and idle.metrics_url is not None
        assert busy.metrics_url != idle.metrics_url
        labels = {"service": "calc", "operation": "add", "status": "200"}
        assert (await scrape(busy.metrics_url)).value("pairlink_calls_total", **labels) == 1
        assert (await scrape(idle.metrics_url)).value("pairlink_calls_total", **labels) is None


async def test_without_metrics_there_is_no_registry_and_no_observer() -> None:
    async with open_server(Calc, listen=URL) as server, connect(server.url) as client:
        assert await client.call("calc", "add", 1, 2) == 3
        assert server.metrics is None and server.metrics_url is None
        assert server.actors["calc"].observer is None


def test_without_metrics_neither_prometheus_client_nor_h11_is_even_imported() -> None:
    program = (
        "import sys, trio\n"
        "from pairlink import open_server, connect, _cli, gateway\n"
        "from services.echo import Echo\n"
        "async def main():\n"
        "    async with open_server(Echo, listen='amqp://127.0.0.1:0') as server:\n"
        "        async with connect(server.url) as client:\n"
        "            assert await client.call('echo', 'echo', 1) == 1\n"
        "trio.run(main)\n"
        "print('prometheus_client' in sys.modules, 'h11' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "False False\n"


@pytest.mark.parametrize("missing", ["prometheus_client", "h11"])
async def test_metrics_without_the_extra_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed
    with pytest.raises(MetricsUnavailable, match=r"pip install 'pairlink-amqp\[metrics\]'"):
        async with open_server(Calc, listen=URL, metrics_listen=METRICS):
            pass  # pragma: no cover


async def test_a_metrics_port_in_use_fails_the_start() -> None:
    taken = trio.socket.socket()
    with taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            async with open_server(Calc, listen=URL, metrics_listen=f"127.0.0.1:{port}"):
                pass  # pragma: no cover


@pytest.mark.parametrize("listen", ["9464", ":9464", "localhost", "::1:9464", "h:99999", "h:x"])
def test_a_bad_metrics_listen_is_refused(listen: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT|brackets"):
        parse_listen(listen)


def test_metrics_listen_forms() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)


async def test_the_endpoint_speaks_enough_http() -> None:
    async with open_server(Calc, listen=URL, metrics_listen=METRICS) as server:
        url = server.metrics_url
        assert url is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url)
        host_port = url.split("/")[2]
        post = f"POST /metrics HTTP/1.1\r\nHost: {host_port}\r\n\r\n".encode()
        status, _, _ = await http_get(url, post)
        assert status.startswith("HTTP/1.1 405")
        status, _, _ = await http_get(url, b"GET /metrics NOT-HTTP\r\n\r\n")
        assert status.startswith("HTTP/1.1 400")
        accept = (
            f"GET /metrics HTTP/1.1\r\nHost: {host_port}\r\n"
            "Accept: application/openmetrics-text; version=1.0.0\r\n\r\n"
        ).encode()
        status, headers, body = await http_get(url, accept)
        assert status.startswith("HTTP/1.1 200")
        assert headers["content-type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")


def test_serve_metrics_listen_on_the_command_line() -> None:
    with Served("services.echo", "--listen", URL, "--metrics-listen", METRICS) as served:
        url = served.url()  # (logged first)
        line = served.wait_for("metrics.listening")
        match = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert match is not None
        with blocking.connect(url) as client:
            assert client.call("echo", "echo", "hi") == "hi"
        got = trio.run(scrape, match.group(1))
        labels = {"service": "echo", "operation": "echo", "status": "200"}
        assert got.value("pairlink_calls_total", **labels) == 1
        assert served.interrupt() == 0


def test_serve_metrics_listen_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        f'listen = "{URL}"\nmetrics_listen = "{METRICS}"\n[[service]]\nmodule = "services.echo"\n'
    )
    with Served("--config", str(config)) as served:
        served.url()
        line = served.wait_for("metrics.listening")
        match = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert match is not None
        got = trio.run(scrape, match.group(1))
        assert got.value("pairlink_mailbox_size", service="echo") is not None
        assert served.interrupt() == 0


def test_serve_refuses_metrics_without_prometheus_client_in_one_line() -> None:
    program = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from pairlink._cli import main\n"
        "sys.exit(main(['serve', 'services.echo', '--listen', 'amqp://127.0.0.1:0',"
        " '--metrics-listen', '127.0.0.1:0']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "pairlink serve: MetricsUnavailable: metrics need prometheus_client: "
        "pip install 'pairlink-amqp[metrics]'"
    )
