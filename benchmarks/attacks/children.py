"""The script's other processes: servers and the normal client, and the servers' RSS."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import resource
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import IO, Any

import attrs
import structlog
import trio

from benchmarks.attacks.phases import STEP_TIMEOUT, phase
from benchmarks.rpc import ROOT, ChildFailed, _child_setup
from pairlink import connect, serve
from services.echo import Echo

LISTEN = "amqp://127.0.0.1:0"
"""Where every server of ours listens: a port of its choosing on 127.0.0.1."""
START_TIMEOUT = 30.0
"""Seconds for a child process to start (imports included) and say it is ready."""
PROBE_TIMEOUT = 10.0
"""Seconds a normal client's call (or fresh login) may take before it counts as not served."""
PROBE_INTERVAL = 0.05
"""Seconds between the normal client's calls on its connection (0.25 for fresh connections):
often enough to see a stall of ~100 ms."""
USER, PASSWORD = "alice", "right-password"
"""The one user of the password attack's server."""
INTERESTING_INFO = re.compile(r"timeout|refus|limit|login|throttl|crash|paus|too")
"""Info-level server log events worth counting beside every warning and error."""
LOG_LINE = re.compile(r"\[(\w+)\s*\]\s+(\S+)")
URL_IN_LOG = re.compile(r"url=((?:amqps?|http)://\S+)")
SERVING = ("server.listening", "gateway.listening")
"""The log events whose URL is where a child serves AMQP (the first one: each worker of a
``--workers`` serve logs its own)."""


def rss_mib(pid: int) -> float | None:
    """The process's resident memory in MiB; None once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


@attrs.frozen
class Probe:
    """One call (or login) of the normal client."""

    ok: bool
    seconds: float
    error: str = ""
    at: float = 0.0  # wall-clock time it started (the prober is another process)


def _server_setup(nofile: int) -> None:  # runs in the child between fork and exec
    _child_setup(None)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = nofile if hard == resource.RLIM_INFINITY else min(nofile, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


@attrs.define(eq=False)
class Child:
    """A process of ours: JSON lines from its stdout, its stderr's tail, its log events."""

    name: str
    proc: subprocess.Popen[bytes]
    pidfd: int  # readable once it has exited
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    tail: deque[str] = attrs.field(factory=lambda: deque(maxlen=30))
    events: Counter[str] = attrs.field(factory=Counter)
    url: str | None = None  # where it first said it listens (a server's or gateway's AMQP URL)
    listening: dict[str, str] = attrs.field(factory=dict)  # the URL of each "*.listening" event
    stdout_closed: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    _news: trio.Event = attrs.field(factory=trio.Event)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.exited.is_set() else None

    def _notify(self) -> None:
        self._news.set()
        self._news = trio.Event()

    def failed(self, what: str) -> ChildFailed:
        tail = "".join(f"\n  {line}" for line in self.tail)
        return ChildFailed(f"{self.name} {what}; its stderr ends with:{tail}")

    async def wait_for(self, done: Callable[[], bool], seconds: float, what: str) -> None:
        with phase(f"{self.name}: {what}", seconds):
            while not done():
                if self.exited.is_set():
                    raise self.failed(f"exited ({self.proc.returncode}) before {what}")
                await self._news.wait()

    def _on_stdout(self, line: str) -> None:
        try:
            self.messages.append(json.loads(line))
        except ValueError:  # not one of ours: a library printed something
            self.tail.append(line)

    def _on_stderr(self, line: str) -> None:
        self.tail.append(line)
        match = LOG_LINE.search(line)
        if match is not None:
            level, event = match.groups()
            if level in ("warning", "error", "critical") or INTERESTING_INFO.search(event):
                self.events[f"{event} ({level})"] += 1
            if event.endswith(".listening") and (url := URL_IN_LOG.search(line)):
                self.listening.setdefault(event, url.group(1))
                if self.url is None and event in SERVING:
                    self.url = url.group(1)
        elif line.startswith("Traceback"):
            self.events["Traceback"] += 1

    async def _read_lines(self, pipe: IO[bytes], take: Callable[[str], None]) -> None:
        stream = trio.lowlevel.FdStream(os.dup(pipe.fileno()))
        pipe.close()
        async with stream:
            buffer = b""
            while chunk := await stream.receive_some(1 << 16):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    take(line.decode(errors="replace"))
                self._notify()

    async def run(self) -> None:
        """Read its output until it exits, then reap it."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_lines, self.proc.stderr, self._on_stderr)
            await self._read_lines(self.proc.stdout, self._on_stdout)
        await self.reap()

    async def reap(self) -> None:
        """Wait for its exit (its pidfd turns readable), then collect its status."""
        if not self.exited.is_set():
            await trio.lowlevel.wait_readable(self.pidfd)
            self.proc.wait()  # it has exited: returns at once
            self.exited.set()
            self._notify()


def spawn(
    argv: tuple[str, ...], nofile: int | None, code: str | None = None
) -> subprocess.Popen[bytes]:
    """``python -m argv...`` in its own session (a Ctrl-C reaches only us), dying with us;
    ``code``: a pairlink checkout whose ``framework/`` comes first on its PYTHONPATH (the
    benchmarks, services and tests still ours).
    Forked from the driver's own thread on purpose, not from a worker thread as
    ``trio.lowlevel.open_process`` does: the death signal fires when the forking thread ends."""
    setup: Callable[[], None] = functools.partial(_child_setup, None)
    if nofile is not None:
        setup = functools.partial(_server_setup, nofile)
    env = None
    if code is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((f"{code}/framework", str(ROOT)))}
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=setup,
    )


@asynccontextmanager
async def child(
    name: str, *argv: str, nofile: int | None = None, code: str | None = None
) -> AsyncIterator[Child]:
    """A process started by :func:`spawn`, killed when the block ends."""
    proc = spawn(argv, nofile, code)
    running = Child(name, proc, os.pidfd_open(proc.pid))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(running.run)
            try:
                yield running
            finally:
                nursery.cancel_scope.cancel()
    finally:
        if not running.exited.is_set():
            proc.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(STEP_TIMEOUT):
            await running.reap()  # even when we are cancelled: no zombie left behind
        os.close(running.pidfd)
        assert proc.stdin is not None
        proc.stdin.close()


class Prober:
    """The normal client, in a process of its own, calling echo until told to stop."""

    def __init__(self, running: Child) -> None:
        self.child = running
        self.finished = False

    @property
    def probes(self) -> list[Probe]:
        return [
            Probe(m["ok"], m["s"], m.get("error", ""), m["at"])
            for m in self.child.messages
            if "ok" in m
        ]

    async def finish(self) -> None:
        """Stop after the call in flight (bounded by its timeout): the end of the window."""
        if self.finished:
            return
        self.finished = True
        stdin = self.child.proc.stdin
        assert stdin is not None
        stdin.close()  # EOF: it stops after its call in flight
        with phase("the normal client's last call", PROBE_TIMEOUT + STEP_TIMEOUT):
            await self.child.exited.wait()  # all its lines read


@asynccontextmanager
async def normal_client(probe: str | None, url: str) -> AsyncIterator[Prober | None]:
    """The normal client of an attack against ``url``, once ready: ``probe`` "persistent"
    (one connection) or "fresh" (a connection per call); None: the attack has its own."""
    if probe is None:
        yield None
        return
    argv = ["benchmarks.attacks", "--child", "probe", "--url", url]
    argv += ["--fresh"] if probe == "fresh" else []
    async with child("normal client", *argv) as running:
        await running.wait_for(
            lambda: any("ready" in m for m in running.messages), START_TIMEOUT, "ready"
        )
        yield Prober(running)


async def probe_main(url: str, fresh: bool) -> None:
    """The prober child: ``{"ready": true}``, then ``{"ok", "s", "error"}`` per call, until
    its stdin closes. ``fresh``: a new connection for every call (connect, call, close)."""

    def emit(**message: Any) -> None:
        print(json.dumps(message), flush=True)

    stop = trio.Event()

    async def watch_stdin() -> None:
        async with trio.lowlevel.FdStream(os.dup(0)) as stdin:
            while await stdin.receive_some():
                pass
        stop.set()

    async def timed(call: Callable[[], Awaitable[Any]]) -> None:
        at, started = time.time(), time.monotonic()
        try:
            with trio.fail_after(PROBE_TIMEOUT):
                await call()
        except Exception as exc:  # whatever it was, the caller was not served: say what
            emit(ok=False, s=time.monotonic() - started, error=type(exc).__name__, at=at)
        else:
            emit(ok=True, s=time.monotonic() - started, at=at)

    async def fresh_call() -> None:
        async with connect(url, timeout=PROBE_TIMEOUT, connect_timeout=PROBE_TIMEOUT) as c:
            await (await c.service("echo")).echo("x")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_stdin)
        if fresh:
            emit(ready=True)
            while not stop.is_set():
                await timed(fresh_call)
                with trio.move_on_after(PROBE_INTERVAL * 5):
                    await stop.wait()
        else:
            async with connect(url, timeout=PROBE_TIMEOUT) as client:
                echo = await client.service("echo")
                await echo.echo("x")
                emit(ready=True)
                while not stop.is_set():
                    await timed(functools.partial(echo.echo, "x"))
                    with trio.move_on_after(PROBE_INTERVAL):
                        await stop.wait()
        nursery.cancel_scope.cancel()


def serve_users() -> None:
    """The password attack's server: echo with one user (the CLI has no users option)."""
    trio.run(functools.partial(serve, Echo, listen=LISTEN, users={USER: PASSWORD}))


def log_to_stderr(level: str) -> None:
    """structlog lines the parent parses (``[level] event key=value``), no colours."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
