"""The ``pairlink`` command: ``call`` against a Proton paired-link server, ``serve`` in a child
process (called, then stopped with Ctrl-C)."""

from __future__ import annotations

import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgpack
import pytest
import structlog
from proton import Message as ProtonMessage

from pairlink._cli import main
from tests.client_peers import proton_arithmetic
from tests.interop.proton_peers import Disposition, ProtonServer


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``main`` configures structlog for the whole process, as a command should; the tests
    after these ones keep their own configuration."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def server() -> Iterator[ProtonServer]:
    with ProtonServer(offered_capabilities=["LINK_PAIR_V1_0"], responder=proton_arithmetic) as px:
        yield px


def test_call_prints_the_reply_as_json(
    server: ProtonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["call", server.url(), "calc", "add", "1", "2"]) == 0
    assert main(["call", server.url(), "calc", "echo", '{"a": [1, "x"]}']) == 0
    assert main(["call", server.url(), "calc", "echo", '"h\u00e9"', "--timeout", "5"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == [3, {"a": [1, "x"]}, "h\u00e9"]
    assert err == ""  # warnings and errors only: nothing went wrong


def test_call_error_reply_exits_1(server: ProtonServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", server.url(), "calc", "nope"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "[404]" in err


def test_call_timeout_exits_1(server: ProtonServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", server.url(), "calc", "hang", "--timeout", "0.2"]) == 1
    assert "TimeoutError" in capsys.readouterr().err


def test_call_without_a_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with ProtonServer() as px:
        url = px.url()
    assert main(["call", url, "calc", "add"]) == 1
    assert "Error" in capsys.readouterr().err


def test_call_arguments_must_be_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["call", "amqp://127.0.0.1:1", "echo", "echo", "hi"])
    assert exc.value.code == 2
    assert "is not JSON" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "call" in capsys.readouterr().out


def test_python_dash_m_pairlink_call(server: ProtonServer) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pairlink", "call", server.url(), "echo", "echo", '"hi"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, '"hi"\n', "")


# -- call: the request's message and the reply's head -----------------------------------------


def what_came(request: ProtonMessage) -> ProtonMessage | None:
    """Answer with what arrived: subject, application-properties, content-type and body (a
    data body in hex), under a status 200 and a subject of its own; nothing to a request
    whose subject is "no" (``echo_server`` rejects those)."""
    if request.subject == "no":
        return None
    body = request.body
    if isinstance(body, memoryview | bytes):
        body = bytes(body).hex()
    content_type = request.content_type
    came = {
        "subject": request.subject,
        "properties": dict(request.properties or {}),
        "content-type": None if content_type == "None" else content_type,  # Proton's none
        "body": body,
    }
    return ProtonMessage(
        body=came, subject="echoed", properties={"status-code": 200, "x-extra": "e"}
    )


@pytest.fixture
def echo_server() -> Iterator[ProtonServer]:
    def refuse_no(message: ProtonMessage) -> Disposition:
        return "reject" if message.subject == "no" else "accept"

    with ProtonServer(
        offered_capabilities=["LINK_PAIR_V1_0"], responder=what_came, disposition=refuse_no
    ) as px:
        yield px


def call_out(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["call", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_call_subject_and_properties(
    echo_server: ProtonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = echo_server.url()
    properties = ["tenant=t1", "n=7", "flag=true", "list=[1, 2]", "text=not json", "eq=a=b"]
    options = [f"--property={p}" for p in properties]
    (line,) = call_out(capsys, url, "svc", "op", '"hi"', "--subject", "GET", *options)
    came = json.loads(line)
    assert came["subject"] == "GET"
    assert came["properties"] == {
        "operation": "op",
        "tenant": "t1",
        "n": 7,
        "flag": True,
        "list": [1, 2],
        "text": "not json",
        "eq": "a=b",
    }


@pytest.mark.parametrize(
    ("encoding", "content_type", "body"),
    [
        ("amqp-value", None, "hi"),
        ("json", "application/json", b'"hi"'.hex()),
        ("msgpack", "application/msgpack", msgpack.packb("hi").hex()),
        ("envelope", "application/x-pairlink-call+msgpack", msgpack.packb([["hi"], {}]).hex()),
        ("raw", "application/octet-stream", b"hi".hex()),
    ],
)
def test_call_encoding(
    echo_server: ProtonServer,
    capsys: pytest.CaptureFixture[str],
    encoding: str,
    content_type: str | None,
    body: str,
) -> None:
    (line,) = call_out(capsys, echo_server.url(), "svc", "op", '"hi"', "--encoding", encoding)
    came = json.loads(line)
    assert (came["content-type"], came["body"]) == (content_type, body)


def test_call_verbose_prints_the_reply_head_first(
    echo_server: ProtonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = echo_server.url()
    head, app, value = call_out(capsys, url, "svc", "op", "-v")
    assert head.startswith("properties: ") and app.startswith("application-properties: ")
    properties = json.loads(head.removeprefix("properties: "))
    assert properties["subject"] == "echoed" and properties["to"] == "$me"
    assert isinstance(properties["correlation-id"], int)  # our request's message-id
    assert json.loads(app.removeprefix("application-properties: ")) == {
        "status-code": 200,
        "x-extra": "e",
    }
    assert json.loads(value)["properties"] == {"operation": "op"}

    lines = call_out(capsys, url, "svc", "op", "--unsettled", "--verbose")
    assert lines[2] == 'outcome: {"accepted": {}}' and len(lines) == 4
    assert main(["call", url, "svc", "op", "--unsettled", "-v", "--subject", "no"]) == 1
    out, err = capsys.readouterr()
    assert out == 'outcome: {"rejected": {}}\n'  # no reply: only the outcome
    assert "request rejected" in err


def test_call_property_must_be_key_equals_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["call", "amqp://127.0.0.1:1", "svc", "op", "--property", "novalue"])
    assert exc.value.code == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err


# -- serve -----------------------------------------------------------------------------------


class Served:
    """``python -m pairlink serve ...`` (or another ``command``, or another ``program``: the
    ``pairlink`` script) in a child process, its stderr read line by line."""

    def __init__(
        self,
        *args: str,
        command: str = "serve",
        program: Sequence[str] = (sys.executable, "-m", "pairlink"),
        cwd: Path | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            [*program, command, *args], stderr=subprocess.PIPE, text=True, cwd=cwd
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def wait_for(self, event: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {event!r} line; saw {self.seen}") from None
            self.seen.append(line)
            if event in line:
                return line

    def url(self, event: str = "server.listening") -> str:
        match = re.search(r"url=(amqps?://\S+)", self.wait_for(event))
        assert match is not None
        return match.group(1)

    def all_lines(self) -> list[str]:
        """Every line the process wrote to stderr, once it has ended."""
        self._reader.join(5)  # it ends at the EOF of a finished process
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.seen

    def interrupt(self, signum: int = signal.SIGINT) -> int:
        self.process.send_signal(signum)
        return self.process.wait(20)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(5)  # it ends at the EOF of a finished process
        assert self.process.stderr is not None
        self.process.stderr.close()


def serving_each(urls: Sequence[str], *modules: str) -> Iterator[list[Served]]:
    """For a fixture: ``pairlink serve MODULES --listen URL`` for each URL, every one listening.
    A test may replace one in the list (same URL); each in the list ends with the fixture."""
    processes = [Served(*modules, "--listen", url) for url in urls]
    try:
        for process in processes:
            process.url()  # listening
        yield processes
    finally:
        for process in processes:  # (SIGKILL ends a stopped one too)
            process.__exit__()


@pytest.mark.parametrize(
    ("spec", "extra", "address"),
    [
        ("services.echo", [], "echo"),
        ("services.echo:Echo", ["--address", "other"], "other"),
    ],
)
def test_serve_until_ctrl_c(
    spec: str, extra: list[str], address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Served(spec, "--listen", "amqp://127.0.0.1:0", *extra) as served:
        url = served.url()
        assert main(["call", url, address, "echo", '"hi"']) == 0
        assert capsys.readouterr().out == '"hi"\n'
        assert served.interrupt() == 0
        served.wait_for("server.stopped")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "no_such_module_here"], "No module named"),
        (["serve", "services.echo:trio"], "is not a @service class"),
        (["serve", "services.echo:Missing"], "Missing"),
        (["serve", "pairlink._rpc.wire"], "defines no @service class"),
        (["serve", "tests.test_client_e2e", "--address", "x"], "exactly one service"),
    ],
)
def test_serve_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_on_a_port_in_use_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with ProtonServer() as px:
        assert main(["serve", "services.echo", "--listen", px.url()]) == 1
    assert "OSError" in capsys.readouterr().err


def test_call_with_a_bad_url_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", "http://127.0.0.1:1", "echo", "echo", "1"]) == 1
    assert "scheme must be amqp" in capsys.readouterr().err


def test_call_timeout_bounds_connecting_to_a_silent_peer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A peer that accepts the connection and never says a word (not even AMQP's header)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        accepted: list[socket.socket] = []
        acceptor = threading.Thread(target=lambda: accepted.append(silent.accept()[0]))
        acceptor.start()
        url = f"amqp://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        assert main(["call", url, "echo", "echo", "1", "--timeout", "1"]) == 1
        elapsed = time.monotonic() - start
        acceptor.join(5)
        for conn in accepted:
            conn.close()
    assert accepted  # it did accept: the time went waiting for its answer
    assert 1 <= elapsed < 3  # not the 30 s connect timeout
    assert "TimeoutError" in capsys.readouterr().err
