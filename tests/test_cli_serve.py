"""``pairlink serve`` as a user runs it, in a child process: a module from the working
directory, a class it cannot create, and a second Ctrl-C while the graceful stop is stuck."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pairlink._client import blocking
from pairlink.errors import PairlinkError
from tests.test_client_cli import Served, restore_logging  # noqa: F401 - autouse fixture

PAIRLINK = (str(Path(sys.executable).with_name("pairlink")),)
"""The console script: unlike ``python -m``, it puts no working directory on ``sys.path``."""

SERVICES = """
import sys

import trio

from pairlink import handler, service


@service("stuck", max_concurrency=4)
class Stuck:
    @handler
    async def echo(self, value):
        return value

    @handler
    async def hang(self):
        print("hang.entered", file=sys.stderr, flush=True)
        await trio.sleep_forever()

    async def on_stop(self):
        print("on_stop.entered", file=sys.stderr, flush=True)
        await trio.sleep_forever()
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "mymodule.py").write_text(textwrap.dedent(SERVICES))
    return tmp_path


def test_serve_imports_a_module_from_the_working_directory(workdir: Path) -> None:
    with Served("mymodule", "--listen", "amqp://127.0.0.1:0", program=PAIRLINK, cwd=workdir) as s:
        with blocking.connect(s.url(), timeout=10) as client:
            assert client.call("stuck", "echo", "here") == "here"
        s.process.send_signal(signal.SIGTERM)
        s.wait_for("on_stop.entered")  # stuck there: a second signal is the way out
        assert s.interrupt(signal.SIGTERM) == 128 + signal.SIGTERM


def test_a_service_that_needs_arguments_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "needy.py").write_text(
        "from pairlink import handler, service\n"
        "@service('needy')\n"
        "class Needy:\n"
        "    def __init__(self, database): ...\n"
        "    @handler\n"
        "    async def get(self): ...\n"
    )
    done = subprocess.run(
        [*PAIRLINK, "serve", "needy"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.startswith("pairlink serve: cannot create Needy()"), done.stderr
    assert "database" in done.stderr
    assert done.stderr.count("\n") == 1  # one line, no traceback


def _call_hang(url: str, entered: threading.Event, failed: list[BaseException]) -> None:
    with blocking.connect(url, timeout=60) as client:
        entered.set()
        try:
            client.call("stuck", "hang")
        except (PairlinkError, TimeoutError) as exc:  # the server went away under the call
            failed.append(exc)


@pytest.mark.parametrize("stuck_in", ["on_stop", "handler"])
def test_a_second_ctrl_c_exits_at_once_without_a_traceback(workdir: Path, stuck_in: str) -> None:
    with Served("mymodule", "--listen", "amqp://127.0.0.1:0", cwd=workdir) as served:
        url = served.url()
        failed: list[BaseException] = []
        connected = threading.Event()
        caller = threading.Thread(target=_call_hang, args=(url, connected, failed), daemon=True)
        if stuck_in == "handler":  # the graceful stop waits for it (10 s of grace)
            caller.start()
            served.wait_for("hang.entered")
        served.process.send_signal(signal.SIGINT)
        served.wait_for("serve.stopping")
        if stuck_in == "on_stop":
            served.wait_for("on_stop.entered")
        start = time.monotonic()
        assert served.interrupt() == 128 + signal.SIGINT
        assert time.monotonic() - start < 5  # at once: not after the grace, nor never
        served.wait_for("serve.exit_now")
        assert not any("Traceback" in line for line in served.all_lines()), served.seen
        if stuck_in == "handler":
            caller.join(10)
            assert len(failed) == 1
