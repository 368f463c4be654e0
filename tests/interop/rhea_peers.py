"""The rhea (Node.js AMQP 1.0) peers of ``tests/interop/rhea/``, run as subprocesses.

``make venv`` installs Node.js (apt-get, where missing) and rhea, pinned, into
``tests/interop/rhea/node_modules`` with ``npm ci``. Nothing here skips: without Node.js or
rhea a test fails and says how to install them, as a missing Qpid Proton would fail the Proton
tests. Every peer talks to 127.0.0.1 only, reads its job as JSON on stdin, answers one line of
JSON on stdout, and ends itself at its own deadline; Python kills it ``SLACK`` seconds later.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

RHEA_DIR = Path(__file__).resolve().with_name("rhea")
RHEA_VERSION = "3.0.5"
"""The rhea that ``tests/interop/rhea/package.json`` pins: the tests name its defects."""
SLACK = 5.0
"""Seconds past a peer's own deadline before the test gives up on the process."""

Sasl = Literal["none", "anonymous", "plain"]
"""How a rhea client opens: ``none`` is rhea's default without a username (the plain AMQP
header, no SASL layer), ``anonymous`` SASL ANONYMOUS, ``plain`` SASL PLAIN."""


class RheaError(RuntimeError):
    """A rhea peer could not run or gave no result: Node.js or rhea missing, a crash, a hang."""


def node_command(script: str) -> list[str]:
    """The command that runs ``script`` of ``tests/interop/rhea`` with the pinned rhea."""
    node = shutil.which("node")
    if node is None:
        raise RheaError(
            "Node.js is not installed: `make venv` installs it (apt-get install nodejs npm) "
            "and rhea (npm ci in tests/interop/rhea)"
        )
    installed = RHEA_DIR / "node_modules" / "rhea" / "package.json"
    if not installed.is_file():
        raise RheaError(f"rhea is not installed in {RHEA_DIR}: run `make venv` (npm ci there)")
    version = json.loads(installed.read_text())["version"]
    if version != RHEA_VERSION:
        raise RheaError(f"rhea {version} in {RHEA_DIR}, not {RHEA_VERSION}: run `make venv`")
    return [node, str(RHEA_DIR / script)]


@attrs.frozen
class Seen:
    """A message as a rhea peer decoded it (binary values come as ``{"binary": base64}``)."""

    message_id: Any
    correlation_id: Any
    to: Any
    reply_to: Any
    subject: Any
    content_type: Any
    application_properties: dict[str, Any] | None
    body: Any
    body_kind: str | None = None  # requests a rhea server saw: amqp-value, data, amqp-sequence

    @property
    def status(self) -> Any:
        return (self.application_properties or {}).get("status-code")


def _seen(fields: dict[str, Any]) -> Seen:
    return Seen(**fields)


@attrs.frozen
class ClientResult:
    """What ``client.js`` reports: the service's offered capabilities, the outcome of each
    request (in request order), every reply, and the first error (None: all went well)."""

    rhea: str | None = None
    pattern: str | None = None
    offered_capabilities: list[str] | None = None
    reply_address: str | None = None
    outcomes: list[str | None] = attrs.field(factory=list)
    replies: list[Seen] = attrs.field(factory=list, converter=lambda rs: [_seen(r) for r in rs])
    error: str | None = None

    def by_correlation_id(self) -> dict[Any, Seen]:
        return {r.correlation_id: r for r in self.replies}


def request(
    message_id: str,
    operation: str,
    body: Any,
    *,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """A request as a rhea user writes it: the operation in the application properties, the
    body an amqp-value (a list: positional arguments, a map: keywords, else one argument).
    Without ``reply_to`` the client fills in ``$me`` (paired) or its dynamic address."""
    out: dict[str, Any] = {
        "message_id": message_id,
        "application_properties": {"operation": operation},
        "body": body,
    }
    if reply_to is not None:
        out["reply_to"] = reply_to
    return out


async def run_client(
    port: int,
    address: str,
    requests: list[dict[str, Any]],
    *,
    pattern: Literal["paired", "dynamic"] = "paired",
    sasl: Sasl = "anonymous",
    user: tuple[str, str] | None = None,
    container_id: str = "rhea-client",
    link_name: str = "rhea-pair",
    time_limit: float = 10.0,
) -> ClientResult:
    """Run ``client.js`` against ``127.0.0.1:port`` until every request has its reply and
    outcome, or for ``time_limit`` seconds at most (then its result says why)."""
    job: dict[str, Any] = {
        "port": port,
        "address": address,
        "requests": requests,
        "pattern": pattern,
        "sasl": sasl,
        "container_id": container_id,
        "link_name": link_name,
        "timeout_ms": int(time_limit * 1000),
    }
    if user is not None:
        job["username"], job["password"] = user
    with trio.fail_after(time_limit + SLACK):
        done = await trio.run_process(
            node_command("client.js"),
            stdin=json.dumps(job).encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    lines = done.stdout.decode().splitlines()
    if not lines:
        raise RheaError(f"client.js gave no result (exit {done.returncode}): {done.stderr!r}")
    return ClientResult(**json.loads(lines[-1]))


@attrs.define
class RheaServer:
    """A running ``server.js``; ``requests`` and ``error`` are filled in when it stops."""

    port: int
    requests: list[Seen] = attrs.field(factory=list)
    error: str | None = None

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"


async def _read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        data = await stream.receive_some()
        if not data:
            raise RheaError(f"server.js ended without a result: {bytes(buffer)!r}")
        buffer += data
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


@asynccontextmanager
async def rhea_server(time_limit: float = 30.0) -> AsyncIterator[RheaServer]:
    """Run ``server.js`` for the block (a free port on 127.0.0.1; it ends itself after
    ``time_limit`` seconds); leaving the block stops it and fills in what it saw. Its stderr
    goes to the test's (pytest shows it on failure)."""
    command = [*node_command("server.js"), "--timeout-ms", str(int(time_limit * 1000))]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stdin is not None and process.stdout is not None
        buffer = bytearray()
        try:
            with trio.fail_after(SLACK):
                started = json.loads(await _read_line(process.stdout, buffer))
            if "port" not in started:
                raise RheaError(f"server.js did not start: {started.get('error')}")
            server = RheaServer(port=started["port"])
            yield server
            await process.stdin.aclose()  # the server's cue to report and exit
            with trio.fail_after(SLACK):
                report = json.loads(await _read_line(process.stdout, buffer))
            server.requests = [_seen(r) for r in report["requests"]]
            server.error = report["error"]
        finally:
            nursery.cancel_scope.cancel()  # kills it if it is still running
