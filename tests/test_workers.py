"""``pairlink serve --workers N`` in real processes: connections spread over the workers, a
killed worker comes back while the others serve on, SIGTERM stops every worker gracefully, a
worker that cannot start fails the serve, and no worker outlives its supervisor."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from pairlink._client import blocking
from pairlink._io.listener import listen
from pairlink._server.workers import WATCHDOG_TIMEOUT, WorkerSettings
from tests.scraping import scrape
from tests.test_client_cli import Served
from tests.test_listener import Handlers

SERVICES = """
import os
import sys

import trio

from pairlink import handler, service


@service("who", max_concurrency=8)
class Who:
    @handler(inline=True)
    def pid(self):
        return os.getpid()

    @handler
    async def slow(self, seconds):
        print("slow.entered", file=sys.stderr, flush=True)
        await trio.sleep(seconds)
        return os.getpid()


@service("stuck")
class Stuck:
    @handler
    async def ping(self):
        return "pong"

    async def on_stop(self):
        await trio.sleep_forever()
"""

FAILING = """
from pairlink import handler, service


@service("broken")
class Broken:
    async def on_start(self):
        raise RuntimeError("no database")

    @handler
    async def get(self):
        return 1
"""

MAX_CONNECTIONS = 64
"""Connections opened at most to find every worker: Linux picks a listener by a hash of the
connection's addresses, so two workers are both found within a few (missed 64 times: 2**-63)."""


class Supervised(Served):
    """A supervisor in a child process; leaving the block kills the workers it started that
    still run (after a failed assertion), so none outlives the test nor holds its stderr."""

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        for line in self.seen:
            if "worker.started" in line and _alive(pid := int(_field(line, "pid"))):
                os.kill(pid, signal.SIGKILL)
        super().__exit__(*exc)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "whomod.py").write_text(textwrap.dedent(SERVICES))
    (tmp_path / "failing.py").write_text(textwrap.dedent(FAILING))
    return tmp_path


@pytest.fixture
def two_workers(workdir: Path) -> Iterator[tuple[Supervised, str, dict[int, int]]]:
    """The supervisor serving ``whomod`` with two workers; its URL and the workers' pids by
    index."""
    listen = ("--listen", "amqp://127.0.0.1:0")
    served = Supervised("whomod:Who", *listen, "--workers", "2", cwd=workdir)
    with served:
        url = served.url("serve.listening")
        yield served, url, _serving(served.seen)


def _serving(lines: list[str]) -> dict[int, int]:
    """The pid of each worker index, from the supervisor's ``worker.serving`` lines."""
    pids = {}
    for line in lines:
        if "worker.serving" in line:
            pids[int(_field(line, "index"))] = int(_field(line, "pid"))
    return pids


def _field(line: str, key: str) -> str:
    match = re.search(rf"\b{key}=(\S+)", line)
    assert match is not None, line
    return match.group(1)


def _answering(url: str, wanted: set[int]) -> set[int]:
    """The worker pids that answer new connections, until ``wanted`` are all among them
    (or :data:`MAX_CONNECTIONS` connections were made)."""
    seen: set[int] = set()
    for _ in range(MAX_CONNECTIONS):
        with blocking.connect(url, timeout=10) as client:
            seen.add(client.call("who", "pid"))
        if wanted <= seen:
            break
    return seen


def _connected_to(url: str, pid: int) -> blocking.Client:
    """A client whose connection the worker ``pid`` accepted."""
    for _ in range(MAX_CONNECTIONS):
        client = blocking.connect(url, timeout=10)
        if client.call("who", "pid") == pid:
            return client
        client.close()
    raise AssertionError(f"no connection reached the worker {pid}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pids: set[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if _alive(p)]}"
        time.sleep(0.02)


def test_connections_are_spread_over_the_workers(
    two_workers: tuple[Supervised, str, dict[int, int]],
) -> None:
    served, url, pids = two_workers
    assert len(pids) == 2
    assert os.getpid() not in pids.values()
    assert served.process.pid not in pids.values()  # the supervisor serves no call
    assert _answering(url, set(pids.values())) == set(pids.values())
    assert served.interrupt(signal.SIGTERM) == 0


def test_a_killed_worker_comes_back_while_the_other_serves_on(
    two_workers: tuple[Supervised, str, dict[int, int]],
) -> None:
    served, url, pids = two_workers
    victim = pids[0]
    with _connected_to(url, pids[1]) as survivor:
        os.kill(victim, signal.SIGKILL)
        exited = served.wait_for("worker.exited")
        assert _field(exited, "pid") == str(victim)
        assert _field(exited, "signal") == "SIGKILL"
        back = served.wait_for("worker.serving")
        assert _field(back, "index") == "0"
        reborn = int(_field(back, "pid"))
        assert reborn not in pids.values()
        assert survivor.call("who", "pid") == pids[1]  # its connection was never cut
        assert _answering(url, {reborn, pids[1]}) == {reborn, pids[1]}
    assert served.interrupt(signal.SIGTERM) == 0
    _wait_gone({reborn, pids[1]})


def test_a_worker_that_stops_answering_is_replaced(
    two_workers: tuple[Supervised, str, dict[int, int]],
) -> None:
    """A worker stopped (SIGSTOP) keeps its listening socket, so Linux goes on handing it
    new connections, which hang: the supervisor notices its silence and replaces it."""
    served, url, pids = two_workers
    wedged = pids[0]
    os.kill(wedged, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        silent = served.wait_for("worker.unresponsive")
        assert _field(silent, "pid") == str(wedged)
        assert time.monotonic() - stopped < WATCHDOG_TIMEOUT + 5
        back = served.wait_for("worker.serving")
        assert _field(back, "index") == "0"
        reborn = int(_field(back, "pid"))
        assert reborn not in pids.values()
        assert not _alive(wedged)
        # every new connection is served again, by one of the two live workers
        answered = [_answering(url, set()) for _ in range(MAX_CONNECTIONS // 4)]
        assert set().union(*answered) <= {reborn, pids[1]}
    finally:
        if _alive(wedged):
            os.kill(wedged, signal.SIGKILL)
    assert served.interrupt(signal.SIGTERM) == 0


def test_each_worker_serves_its_own_metrics(workdir: Path) -> None:
    argv = ("--listen", "amqp://127.0.0.1:0", "--workers", "2")
    with Supervised("whomod:Who", *argv, "--metrics-listen", "127.0.0.1:0", cwd=workdir) as served:
        url = served.url("serve.listening")
        pids = _serving(served.seen)
        endpoints = {
            int(_field(line, "worker")): _field(line, "url")
            for line in served.seen
            if "metrics.listening" in line
        }
        assert sorted(endpoints) == [0, 1] and endpoints[0] != endpoints[1]
        calls = 0
        seen: set[int] = set()
        while seen != set(pids.values()):
            assert calls < MAX_CONNECTIONS, f"only {seen} of {pids} answered"
            with blocking.connect(url, timeout=10) as client:
                seen.add(client.call("who", "pid"))
            calls += 1
        counted = [
            trio.run(scrape, endpoints[index]).value(
                "pairlink_calls_total", service="who", operation="pid", status="200"
            )
            for index in (0, 1)
        ]
        assert all(count is not None and count >= 1 for count in counted), counted
        assert sum(count or 0 for count in counted) == calls
        assert served.interrupt(signal.SIGTERM) == 0


@pytest.mark.parametrize(
    ("index", "listen", "expected"),
    [
        (0, "127.0.0.1:9464", "127.0.0.1:9464"),
        (3, "127.0.0.1:9464", "127.0.0.1:9467"),
        (3, "127.0.0.1:0", "127.0.0.1:0"),
        (1, "[::1]:9464", "[::1]:9465"),
    ],
)
def test_worker_i_takes_the_metrics_port_plus_i(index: int, listen: str, expected: str) -> None:
    settings = WorkerSettings(index, channel=-1, listen=("amqp://127.0.0.1:5672",))
    assert settings.metrics_listen(listen) == expected


def test_sigterm_stops_every_worker_gracefully(
    two_workers: tuple[Supervised, str, dict[int, int]],
) -> None:
    served, url, pids = two_workers
    answers: list[int] = []

    def slow_call() -> None:
        with blocking.connect(url, timeout=10) as client:
            answers.append(client.call("who", "slow", 0.5))

    caller = threading.Thread(target=slow_call)
    caller.start()
    served.wait_for("slow.entered")
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(20) == 0
    caller.join(10)
    assert answers and answers[0] in pids.values()  # the call in flight was answered
    lines = served.all_lines()
    stopped = [line for line in lines if "worker.stopped" in line]
    assert sorted(int(_field(line, "pid")) for line in stopped) == sorted(pids.values())
    assert all(_field(line, "exit_code") == "0" for line in stopped), stopped
    assert sum("server.stopped" in line for line in lines) == 2  # each worker's graceful end
    assert not any(_alive(pid) for pid in pids.values())


def test_a_worker_that_cannot_start_fails_the_serve(workdir: Path) -> None:
    listen = ("--listen", "amqp://127.0.0.1:0")
    with Supervised("failing", *listen, "--workers", "2", cwd=workdir) as s:
        assert s.process.wait(20) == 1
        lines = s.all_lines()
    assert any("pairlink serve: WorkerError: worker" in line for line in lines), lines
    assert not any("serve.listening" in line for line in lines)
    started = {int(_field(line, "pid")) for line in lines if "worker.started" in line}
    assert len(started) == 2
    assert not any(_alive(pid) for pid in started)


def test_a_second_signal_exits_at_once_and_takes_the_workers_along(workdir: Path) -> None:
    listen = ("--listen", "amqp://127.0.0.1:0")
    with Supervised("whomod", *listen, "--workers", "2", cwd=workdir) as served:
        served.url("serve.listening")
        pids = set(_serving(served.seen).values())
        served.process.send_signal(signal.SIGINT)
        served.wait_for("serve.stopping")  # the supervisor's, then its workers' (Stuck's on_stop)
        start = time.monotonic()
        assert served.interrupt() == 128 + signal.SIGINT
        assert time.monotonic() - start < 5
        _wait_gone(pids)  # the workers saw their supervisor go, and exited at once too


def test_workers_stop_when_their_supervisor_is_killed(
    two_workers: tuple[Supervised, str, dict[int, int]],
) -> None:
    served, _url, pids = two_workers
    served.process.kill()
    _wait_gone(set(pids.values()))
    lines = served.all_lines()
    assert sum("worker.orphaned" in line for line in lines) == 2, lines
    assert sum("server.stopped" in line for line in lines) == 2  # gracefully


async def test_listeners_that_reuse_the_port_share_it() -> None:
    handlers = Handlers()
    url = "amqp://127.0.0.1:0"
    async with listen(url, accept=handlers.accept, reuse_port=True) as first:
        shared = f"amqp://127.0.0.1:{first.port}"
        async with listen(shared, accept=handlers.accept, reuse_port=True) as second:
            assert second.port == first.port
            with pytest.raises(OSError):  # a listener that does not ask to share finds it taken
                async with listen(shared, accept=handlers.accept):
                    pass
            with trio.fail_after(10):
                conn = await trio.open_tcp_stream("127.0.0.1", first.port)
            await conn.aclose()  # accepted by one of the two


def test_workers_stop_when_their_supervisor_is_killed_and_nobody_reads_their_log(
    workdir: Path,
) -> None:
    """The supervisor's stderr, which the workers share, is closed by its reader, then the
    supervisor is killed: the workers' log line about it fails (a broken pipe), and they stop
    all the same."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pairlink", "serve", "--listen", "amqp://127.0.0.1:0",
         "--workers", "2", "whomod:Who"],
        stderr=subprocess.PIPE, text=True, cwd=workdir,
    )  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    pids: set[int] = set()
    try:
        while not any("serve.listening" in line for line in lines):
            line = process.stderr.readline()
            assert line, lines
            lines.append(line)
        pids = set(_serving(lines).values())
        assert len(pids) == 2
        process.stderr.close()
        process.kill()
        process.wait(10)
        _wait_gone(pids)
    finally:
        if process.poll() is None:
            process.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
