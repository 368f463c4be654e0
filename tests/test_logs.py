"""Logs the application controls: a library that prints nothing of itself, records that go
through :mod:`logging` when the application asks for them, and the command's
``--log-level``/``--log-format``; each line of a call names its connection, link and
message-id."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from pairlink import RemoteError, connect, handler, open_server, service
from tests.test_client_cli import Served

URL = "amqp://127.0.0.1:0"


@service("failing")
class Failing:
    """A service whose one operation fails unexpectedly: the actor logs it at ERROR."""

    @handler
    async def boom(self) -> None:
        logging.getLogger(__name__).warning("boom.coming")  # the service's own, stdlib, log
        raise RuntimeError("boom")


CALL_IDS = {"conn", "link", "message_id"}


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """The process as a library user's: structlog never configured (other tests' captures
    leave it configured)."""
    saved, was = structlog.get_config(), structlog.is_configured()
    structlog.reset_defaults()
    yield
    if was:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


LIBRARY_USE = """
import logging, sys, trio
from pairlink import RemoteError, connect, open_server
from tests.test_logs import Failing

if sys.argv[1] == "basicConfig":
    logging.basicConfig(level=logging.INFO)

async def main() -> None:
    async with open_server(Failing, listen="amqp://127.0.0.1:0") as server:
        async with connect(server.url, timeout=10) as client:
            try:
                await client.call("failing", "boom")
            except RemoteError:
                pass

trio.run(main)
"""


def run_library(setup: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LIBRARY_USE), setup],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_library_prints_nothing_unless_the_application_configures_logging() -> None:
    """A server, a client and a failed call (an ERROR line): nothing of pairlink's on stdout
    or stderr, though Python's last-resort handler prints the service's own warning."""
    done = run_library("nothing")
    assert (done.stdout, done.stderr) == ("", "boom.coming\n")


def test_basic_config_shows_the_lines_from_its_level() -> None:
    done = run_library("basicConfig")
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    (failed,) = [line for line in lines if "call.failed" in line]
    assert failed.startswith("ERROR:pairlink.service:call.failed service=failing conn=")
    assert " link=" in failed and " message_id=" in failed
    assert "Traceback" in done.stderr and "RuntimeError: boom" in done.stderr
    assert any(line.startswith("INFO:pairlink.service:server.listening") for line in lines)
    assert not any(line.startswith("DEBUG:") for line in lines)  # below the level asked for


async def test_records_carry_the_fields_of_the_line(
    unconfigured_structlog: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pairlink")
    async with open_server(Failing, listen=URL) as server, connect(server.url, timeout=10) as c:
        with pytest.raises(RemoteError):
            await c.call("failing", "boom")
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "call.failed"]
    fields: dict[str, Any] = vars(record)
    assert record.name == "pairlink.service" and record.levelno == logging.ERROR
    assert all(fields[key] is not None for key in CALL_IDS)
    assert fields["service"] == "failing" and fields["operation"] == "boom"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert record.getMessage().startswith(f"call.failed service=failing conn={fields['conn']}")
    assert record.funcName == "undisclosed"  # the line that logged, not the logging module


@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_the_command_logs_json_lines_from_the_level_asked(before: bool) -> None:
    """``--log-level`` and ``--log-format`` before or after the subcommand; every stderr line
    is a JSON object with a level and an event; a call's lines name conn, link, message-id."""
    options = ["--log-level", "debug", "--log-format", "json"]
    args = ["tests.test_logs:Failing", "--listen", URL]
    argv = [*options, "serve", *args] if before else ["serve", *args, *options]
    with Served(*argv[1:], command=argv[0]) as served:
        url = json.loads(served.wait_for('"server.listening"'))["url"]
        call = [sys.executable, "-m", "pairlink", "call", url, "failing", "boom"]
        assert subprocess.run(call, capture_output=True, timeout=30).returncode == 1
        served.wait_for('"call.failed"')
        assert served.interrupt() == 0
    served.seen.extend(served.lines.queue)
    entries = [json.loads(line) for line in served.seen]
    assert all({"level", "event", "timestamp"} <= entry.keys() for entry in entries)
    assert "debug" in {entry["level"] for entry in entries}
    (failed,) = [entry for entry in entries if entry["event"] == "call.failed"]
    assert failed["level"] == "error" and "RuntimeError: boom" in failed["exception"]
    assert all(failed[key] is not None for key in CALL_IDS)
    (own,) = [entry for entry in entries if entry["event"] == "boom.coming"]
    assert (own["level"], own["logger"]) == ("warning", __name__)


def test_the_command_logs_from_info_by_default() -> None:
    with Served("tests.test_logs:Failing", "--listen", URL) as served:
        assert "[info" in served.wait_for("server.listening")  # console lines, not JSON
        assert served.interrupt() == 0
    served.seen.extend(served.lines.queue)
    assert not any("[debug" in line for line in served.seen)


async def test_an_application_that_configured_structlog_gets_the_lines_there(
    unconfigured_structlog: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Its processors see pairlink's lines (here a capture), and logging does not: one
    destination, the application's choice."""
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as entries:
        async with open_server(Failing, listen=URL) as server, connect(server.url) as client:
            with pytest.raises(RemoteError):
                await client.call("failing", "boom")
    (failed,) = [e for e in entries if e["event"] == "call.failed"]
    assert failed["log_level"] == "error" and failed["service"] == "failing"
    assert all(failed[key] is not None for key in CALL_IDS)
    assert not [r for r in caplog.records if r.name.startswith("pairlink")]
