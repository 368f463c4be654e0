"""``pairlink serve --workers N``: N processes serve on the same port, under a supervisor.

One Trio run uses one core; a service that needs more runs in several processes. Each worker
is the ordinary single-process serve (its own Trio run, its own services), started afresh as
``python -m pairlink serve`` with the user's arguments (never a fork of a running Trio
process), and listens with ``SO_REUSEPORT``: Linux hands each new connection to one of the
listening workers, so load spreads by connection, not by call.

The supervisor (the process the user started) holds every listen address: bound with
``SO_REUSEPORT`` but never listening, so it gets no connection. With port 0 that is what picks
the one port all workers share, and while a worker restarts no other program can take it. It
starts the workers, logs ``serve.listening`` once all of them serve, and restarts one that dies
(after a capped, jittered backoff). At SIGINT or SIGTERM it sends each worker SIGTERM, the
single-process serve's graceful stop, and waits for it (its grace period plus
:data:`STOP_MARGIN`, then SIGKILL); a second signal kills them all at once. A worker that exits
before it ever served, while the serve starts, fails the whole serve: its configuration would
fail every restart too.

A worker learns what makes it one from the environment variable :data:`WORKER_ENV` (removed
at once, so that the programs it starts are not workers): its listen URLs, with their shared
port, and its end of a socket pair with the supervisor. The worker writes one JSON line on
it once it serves (its grace period), and the end of it tells the worker that its supervisor is
gone (killed, or exiting at once on a second Ctrl-C): the worker then sends itself SIGTERM, the
stop its supervisor would have asked for (graceful, or at once if it was stopping already), so
that no worker outlives its supervisor. Workers run in a process group of their own: a Ctrl-C at
the terminal reaches the supervisor only, which stops them itself; else each worker would count
the terminal's SIGINT and the supervisor's SIGTERM as two signals, and exit at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

from pairlink._io.backoff import jittered_backoff
from pairlink._io.listener import bind_reuse_port
from pairlink._io.net import AmqpUrl
from pairlink._server.serving import Server
from pairlink._telemetry.logs import get_logger
from pairlink._telemetry.metrics import parse_listen
from pairlink.errors import PairlinkError

log = get_logger("pairlink.workers")

STOP_MARGIN = 5.0
"""Seconds a stopping worker gets beyond its grace period (its ``on_stop`` hooks, closing its
connections) before the supervisor kills it."""
RESTART_BASE = 0.5
"""The first restart of a dead worker waits up to this long (half of it at least)..."""
RESTART_CAP = 30.0
"""...each next one twice as long, up to this: a worker that dies at once is not a busy loop."""
STABLE_AFTER = 30.0
"""A worker that served this long before it died restarts with the first delay again."""

HEARTBEAT = 1.0
"""Seconds between a serving worker's heartbeats to its supervisor, sent from its event loop:
a heartbeat says the loop runs, not only the process."""
WATCHDOG_TIMEOUT = 5.0
"""Seconds without a heartbeat after which the supervisor takes a serving worker for wedged
(stopped, or its loop blocked) and replaces it: killed, then restarted as a dead one is."""

WORKER_ENV = "PAIRLINK_WORKER"
"""Set (to JSON: :class:`WorkerSettings`) for the worker processes of a supervisor only."""


class WorkerError(PairlinkError):
    """A worker exited before it served, while the serve started."""


@attrs.frozen
class WorkerSettings:
    """What a supervisor tells its worker: its index (0 to N-1, the same after a restart),
    its end of their socket pair, and the URLs to listen on (those of the serve, with the
    ports the supervisor holds)."""

    index: int
    channel: int
    listen: tuple[str, ...]

    def metrics_listen(self, listen: str) -> str:
        """This worker's metrics endpoint (``HOST:PORT``): Prometheus scrapes each process
        apart, so worker ``i`` takes the port ``PORT + i`` (with port 0, a free one each,
        logged)."""
        host, port = parse_listen(listen)
        shown = f"[{host}]" if ":" in host else host
        return f"{shown}:{port + self.index if port else 0}"


def worker_settings() -> WorkerSettings | None:
    """This process's settings if it is a worker of ``--workers`` (taken out of the
    environment), else None."""
    text = os.environ.pop(WORKER_ENV, None)
    if text is None:
        return None
    settings = json.loads(text)
    return WorkerSettings(
        int(settings["index"]), int(settings["channel"]), tuple(settings["listen"])
    )


async def supervise(command: Sequence[str], listen: Sequence[str], workers: int) -> int:
    """Serve with ``workers`` processes, each running ``command`` (the user's ``python -m
    pairlink serve ...``) as a worker sharing the ports of the ``listen`` URLs, until SIGINT
    or SIGTERM; then stop them gracefully, or at once on a second signal. The main of its
    process (it takes the signals): returns the exit code, 0 or 128 + the second signal."""
    if not sys.platform.startswith("linux"):
        raise ValueError("--workers needs Linux, whose SO_REUSEPORT spreads connections")
    held: list[trio.socket.SocketType] = []
    try:
        urls = []
        for url in listen:
            parsed = AmqpUrl.parse(url)
            sockets = await bind_reuse_port(parsed.host, parsed.port)
            held += sockets
            urls.append(_with_port(url, sockets[0].getsockname()[1]))
        return await _Supervisor(list(command), urls, workers).run()
    finally:
        for sock in held:
            sock.close()


def _with_port(url: str, port: int) -> str:
    """``url`` with its port replaced (or given) by ``port``."""
    parts = urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    host = hostport if parts.port is None else hostport[: hostport.rindex(":")]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@attrs.define
class _Worker:
    """A worker process and the supervisor's end of its socket pair."""

    index: int
    process: trio.Process
    channel: trio.SocketStream
    grace: float | None = None
    """The grace period of its server, known once it serves."""
    waiting: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    """Around the wait for its end: a stop gives it a deadline, then SIGKILL."""


class _Supervisor:
    """Stops by its own flag, not by cancellation: the signals are its own to take, so that
    the first one reaches every worker at once, and a second kills them before it returns."""

    def __init__(self, command: list[str], urls: list[str], count: int) -> None:
        self.command = command
        self.urls = urls
        self.count = count
        self.running: dict[int, _Worker] = {}
        self.served: set[int] = set()
        """The workers that served once: all of them, and the serve has started."""
        self.stopping = trio.Event()
        self.failure: WorkerError | None = None

    async def run(self) -> int:
        exit_code = 0
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def keep_all() -> None:
                    async with trio.open_nursery() as workers:
                        for index in range(self.count):
                            workers.start_soon(self._keep, index)
                    nursery.cancel_scope.cancel()  # every worker is gone: no signal to wait for

                nursery.start_soon(keep_all)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not self.stopping.is_set():
                        log.info("serve.stopping", signal=name)
                        self._stop()
                        continue
                    log.warning("serve.exit_now", signal=name)
                    exit_code = 128 + signum
                    for worker in self.running.values():
                        worker.process.kill()
        if self.failure is not None:
            raise self.failure
        return exit_code

    def _stop(self) -> None:
        self.stopping.set()
        for worker in self.running.values():
            self._stop_worker(worker)

    def _stop_worker(self, worker: _Worker) -> None:
        """SIGTERM, the worker's graceful stop; SIGKILL once its grace and a margin are over."""
        worker.process.send_signal(signal.SIGTERM)
        worker.waiting.deadline = trio.current_time() + (worker.grace or 0.0) + STOP_MARGIN

    async def _keep(self, index: int) -> None:
        """Run worker ``index``, again each time it dies, until the stop."""
        failures = 0
        while not self.stopping.is_set():
            began = trio.current_time()
            try:
                worker = await self._spawn(index)
            except OSError as exc:
                self.failure = WorkerError(f"worker {index} could not start: {exc}")
                self._stop()
                return
            with worker.waiting:
                served = await self._wait_serving(worker)
                if served:
                    await self._watch(worker)
                await worker.process.wait()
            pid = worker.process.pid
            if worker.process.returncode is None:
                log.warning("worker.killed", index=index, pid=pid, grace=worker.grace)
                worker.process.kill()
            status = _status_fields(await worker.process.wait())
            del self.running[index]
            worker.channel.socket.close()
            if self.stopping.is_set():
                log.info("worker.stopped", index=index, pid=pid, **status)
                return
            if not served and len(self.served) < self.count:  # the serve is starting
                fields = ", ".join(f"{key} {value}" for key, value in status.items())
                self.failure = WorkerError(f"worker {index} exited ({fields}) before it served")
                self._stop()
                return
            if trio.current_time() - began >= STABLE_AFTER:
                failures = 0
            failures += 1
            delay = jittered_backoff(failures, RESTART_BASE, RESTART_CAP)
            log.warning("worker.exited", index=index, pid=pid, **status, restart_in=round(delay, 2))
            with trio.move_on_after(delay):
                await self.stopping.wait()

    async def _spawn(self, index: int) -> _Worker:
        ours, theirs = socket.socketpair()
        settings = {"index": index, "channel": theirs.fileno(), "listen": self.urls}
        try:
            process = await trio.lowlevel.open_process(
                self.command,
                env={**os.environ, WORKER_ENV: json.dumps(settings)},
                pass_fds=(theirs.fileno(),),
                process_group=0,  # the terminal's Ctrl-C is for the supervisor alone
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        # no checkpoint before it is registered: a stop that comes now finds it
        worker = self.running[index] = _Worker(
            index, process, trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        )
        log.info("worker.started", index=index, pid=process.pid)
        if self.stopping.is_set():  # the stop came while the process started
            self._stop_worker(worker)
        return worker

    async def _watch(self, worker: _Worker) -> None:
        """Until ``worker`` ends its side of the channel: kill it if its heartbeats stop for
        :data:`WATCHDOG_TIMEOUT` while it serves (a stopping worker may be busy stopping: its
        stop has a deadline of its own)."""
        while True:
            timeout = math.inf if self.stopping.is_set() else WATCHDOG_TIMEOUT
            with trio.move_on_after(timeout) as silent:
                try:
                    beat = await worker.channel.receive_some()
                except trio.BrokenResourceError:
                    beat = b""
            if silent.cancelled_caught and not self.stopping.is_set():
                log.warning(
                    "worker.unresponsive",
                    index=worker.index,
                    pid=worker.process.pid,
                    silent=WATCHDOG_TIMEOUT,
                )
                worker.process.kill()  # (a stopped process dies of SIGKILL too)
                return
            if not silent.cancelled_caught and not beat:
                return  # it exited, or closed its end

    async def _wait_serving(self, worker: _Worker) -> bool:
        """Whether ``worker`` says it serves (its grace period then known), or exits first."""
        received = b""
        while not received.endswith(b"\n"):
            try:
                chunk = await worker.channel.receive_some()
            except trio.BrokenResourceError:
                chunk = b""
            if not chunk:
                return False
            received += chunk
        line = received.partition(b"\n")[0]  # (its first heartbeats may follow in the read)
        worker.grace = float(json.loads(line)["grace"])
        log.info("worker.serving", index=worker.index, pid=worker.process.pid)
        if worker.index not in self.served:
            self.served.add(worker.index)
            if len(self.served) == self.count:
                for url in self.urls:
                    log.info("serve.listening", url=url, workers=self.count)
        return True


def _status_fields(status: int) -> dict[str, object]:
    """An exit status as log fields: the exit code, or the signal that ended the process."""
    if status < 0:
        return {"signal": signal.Signals(-status).name}
    return {"exit_code": status}


# -- the worker's side -----------------------------------------------------------------------


async def serve_worker(run: Callable[..., Awaitable[None]], settings: WorkerSettings) -> None:
    """Run ``run`` (``serve`` with its arguments: ``settings.listen``, ``reuse_port=True``)
    as a worker whose supervisor holds the other end of ``settings.channel``: tell it once
    serving, and stop if it goes away (see the module's documentation)."""
    lifeline = socket.socket(fileno=settings.channel)
    lifeline.setblocking(True)
    threading.Thread(
        target=_stop_when_closed, args=(lifeline,), name="pairlink-lifeline", daemon=True
    ).start()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(_run_then_cancel, run, nursery.cancel_scope)
        # one short line into an empty socket buffer: it never blocks
        lifeline.sendall(json.dumps({"grace": server.grace}).encode() + b"\n")
        nursery.start_soon(_heartbeats, lifeline)


async def _run_then_cancel(
    run: Callable[..., Awaitable[None]],
    done: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``run``, then the end of the heartbeats beside it."""
    await run(task_status=task_status)
    done.cancel()


async def _heartbeats(lifeline: socket.socket) -> None:
    """A byte every :data:`HEARTBEAT` seconds from the event loop, while the worker serves and
    while it stops (one byte into a socket its supervisor drains: it never blocks)."""
    while True:
        await trio.sleep(HEARTBEAT)
        with contextlib.suppress(OSError):  # the supervisor is gone: the lifeline thread acts
            lifeline.send(b".")


def _stop_when_closed(lifeline: socket.socket) -> None:
    """In a thread, so that it watches on through the graceful stop too: once the supervisor's
    end closes, the stop it would have asked for."""
    with contextlib.suppress(OSError):
        while lifeline.recv(64):
            pass
    try:
        log.warning("worker.orphaned", pid=os.getpid())
    finally:  # the log's stream may have gone with the supervisor (a broken pipe): stop anyway
        os.kill(os.getpid(), signal.SIGTERM)
