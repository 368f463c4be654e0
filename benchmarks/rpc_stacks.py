"""The processes of the RPC benchmark (:mod:`benchmarks.rpc`): one echo server and one echo client
per stack, each driven by the benchmark's driver through JSON lines on its stdin and stdout.

Every child moves its stdout aside first (fd 1 becomes stderr, so a library that prints or logs
to stdout cannot corrupt the control channel) and exits as soon as its stdin reaches EOF, so a
driver that dies leaves no process behind.

Server: ``{"ready": port}``, then answers each ``{"snap": ...}`` with its own CPU time so far
(``resource.getrusage``: every thread of the process, user + system), optionally switching its
cProfile on or off in the thread that serves (``"profile": "on" | "off"``).

Client: ``{"hello": ...}``; gets ``{"port": P}``; warms up; then for each phase sends ``{"mark":
phase}``, waits for ``"go"`` (the driver snapshots the server), runs it, sends ``{"done": phase,
...}`` with its counts and latencies and waits for ``"ok"``; at last ``{"finished": true}``.
"""

from __future__ import annotations

import cProfile
import functools
import itertools
import json
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

PAYLOAD = bytes(range(64))
"""The argument of every call, echoed back."""
PREFETCH = 1000
"""Proton receivers' credit window: MessagingHandler's default of 10 starves a pipelined peer."""
GRPC_METHOD = "/pairlink.bench.Echo/Echo"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@attrs.define
class Plan:
    """What a client does: pipelined with ``inflight`` calls for ``duration`` seconds (after a
    ``warmup``), then ``latency_calls`` calls one at a time."""

    inflight: int
    duration: float
    warmup: float
    latency_calls: int
    profile_out: str | None = None
    """Client side: profile ``profile_phase`` into this file."""
    profile_phase: str = "throughput"
    operation: str = "echo"
    """The pairlink echo service's operation called: one per kind of handler."""


class Control:
    """The child's end of the driver's pipes."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # anything printed or logged to stdout goes to stderr from now on
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, **message: Any) -> None:
        with self._lock:
            self._out.write(json.dumps(message) + "\n")
            self._out.flush()

    def receive(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:  # the driver is gone
            os._exit(3)
        message: dict[str, Any] = json.loads(line)
        return message


# ---------------------------------------------------------------------------------------------
# Servers


class ServerControl:
    """Answers the driver from a thread while the stack serves in the main thread."""

    def __init__(self, ctl: Control, *, profile_out: str | None = None) -> None:
        self.ctl = ctl
        self.profile_out = profile_out
        self.profiler: cProfile.Profile | None = None
        self.in_serving_thread: Callable[[Callable[[], None]], None] | None = None
        """Runs a function in the thread that serves (cProfile only sees its own thread)."""

    def ready(self, port: int) -> None:
        self.ctl.send(ready=port)
        threading.Thread(target=self._loop, name="bench-control", daemon=True).start()

    def _loop(self) -> None:
        try:
            while True:
                line = sys.stdin.readline()
                if not line:  # the driver is done (or gone): the serving threads go with us
                    os._exit(0)
                profile = json.loads(line).get("profile")
                if profile == "on":
                    self._profile_on()
                cpu = cpu_seconds()
                if profile == "off":
                    self._profile_off()
                self.ctl.send(cpu=cpu)
        except BaseException:
            traceback.print_exc()
            os._exit(1)  # the driver sees the exit and shows this traceback

    def _profile_on(self) -> None:
        if self.in_serving_thread is None:
            raise RuntimeError("this server cannot be profiled")
        self.profiler = cProfile.Profile()
        self.in_serving_thread(self.profiler.enable)

    def _profile_off(self) -> None:
        profiler = self.profiler
        if profiler is None or self.in_serving_thread is None:
            return
        self.in_serving_thread(profiler.disable)
        if self.profile_out is not None:
            profiler.dump_stats(self.profile_out)


_PAIRLINK_LISTEN = "amqp://127.0.0.1:0"


def serve_pairlink(control: ServerControl) -> None:
    import trio

    from pairlink import serve
    from services.echo import Echo

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()

        def in_trio(fn: Callable[[], None]) -> None:
            trio.from_thread.run_sync(fn, trio_token=token)

        control.in_serving_thread = in_trio
        async with trio.open_nursery() as nursery:
            server = await nursery.start(functools.partial(serve, Echo, listen=_PAIRLINK_LISTEN))
            control.ready(int(server.url.rsplit(":", 1)[1]))

    trio.run(main)


def serve_proton(control: ServerControl) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class EchoServer(MessagingHandler):
        """Echoes each request's body to its reply-to: the dynamic node the client attached."""

        def __init__(self) -> None:
            super().__init__(prefetch=PREFETCH, auto_accept=False, auto_settle=True)
            self.replies: dict[tuple[Any, str], Any] = {}
            self.ids = itertools.count(1)

        def on_link_opening(self, event: Any) -> None:
            link = event.link
            # Copy first, then fill in the dynamic address: the other order wipes the address.
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.snd_settle_mode = link.remote_snd_settle_mode
            if link.is_sender and link.remote_source.dynamic:
                address = f"reply-{next(self.ids)}"
                link.source.address = address
                self.replies[(link.connection, address)] = link

        def on_message(self, event: Any) -> None:
            request = event.message
            sender = self.replies.get((event.connection, request.reply_to))
            if sender is not None:
                sender.send(
                    Message(
                        body=request.body,
                        correlation_id=request.id,
                        address=request.reply_to,
                        inferred=True,
                    )
                )
            event.delivery.settle()

        def on_link_closing(self, event: Any) -> None:
            self.replies = {k: v for k, v in self.replies.items() if v is not event.link}

    container = Container(EchoServer())
    acceptor = container.listen("127.0.0.1:0")
    # Proton has no public accessor for the bound port (same workaround as the interop tests).
    listening: Any = acceptor._selectable._delegate
    port = listening.getsockname()[1]
    control.ready(int(port))
    container.run()


def serve_grpc(control: ServerControl) -> None:
    import asyncio

    import grpc

    async def echo(request: bytes, _context: Any) -> bytes:
        return request

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "pairlink.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        control.ready(port)
        await server.wait_for_termination()

    asyncio.run(main())


SERVERS: dict[str, Callable[[ServerControl], None]] = {
    "pairlink": serve_pairlink,
    "proton": serve_proton,
    "grpc": serve_grpc,
}


# ---------------------------------------------------------------------------------------------
# Clients


class Phases:
    """The client's side of the phase protocol, shared by every stack."""

    def __init__(self, ctl: Control, plan: Plan) -> None:
        self.ctl = ctl
        self.plan = plan
        self.profiler: cProfile.Profile | None = None
        self._cpu = 0.0

    def begin(self, phase: str) -> None:
        self.ctl.send(mark=phase)
        self.ctl.receive()
        if phase == self.plan.profile_phase and self.plan.profile_out is not None:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        self._cpu = cpu_seconds()

    def end(self, phase: str, calls: int, elapsed: float, latencies: list[int] | None) -> None:
        cpu = cpu_seconds() - self._cpu
        if self.profiler is not None:
            self.profiler.disable()
            assert self.plan.profile_out is not None
            self.profiler.dump_stats(self.plan.profile_out)
            self.profiler = None
        report: dict[str, Any] = {
            "done": phase,
            "calls": calls,
            "elapsed": elapsed,
            "cpu": cpu,
        }
        if latencies:
            cuts = statistics.quantiles(latencies, n=100, method="inclusive")
            report.update(
                p50=cuts[49] / 1e3, p99=cuts[98] / 1e3, mean=statistics.fmean(latencies) / 1e3
            )
        self.ctl.send(**report)
        self.ctl.receive()

    def finish(self) -> None:
        self.ctl.send(finished=True)


def _check(reply: Any) -> None:
    if reply != PAYLOAD:
        raise AssertionError(f"wrong echo: {reply!r}")


async def _phases(
    phases: Phases,
    call: Callable[[], Awaitable[Any]],
    run_all: Callable[[list[Callable[[], Awaitable[None]]]], Awaitable[None]],
) -> None:
    """Warm-up, the pipelined phase (``plan.inflight`` workers, run concurrently by the
    event loop's own ``run_all``) and the sequential phase, the same for every async stack."""
    plan = phases.plan

    async def pipelined(seconds: float) -> tuple[int, float]:
        done = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                _check(await call())
                done += 1

        await run_all([worker] * plan.inflight)
        return done, time.perf_counter() - start

    await pipelined(plan.warmup)
    phases.begin("throughput")
    phases.end("throughput", *await pipelined(plan.duration), None)
    phases.begin("latency")
    latencies = []
    start = time.perf_counter()
    for _ in range(plan.latency_calls):
        t0 = time.perf_counter_ns()
        _check(await call())
        latencies.append(time.perf_counter_ns() - t0)
    phases.end("latency", plan.latency_calls, time.perf_counter() - start, latencies)
    phases.finish()


async def _trio_run_all(workers: list[Callable[[], Awaitable[None]]]) -> None:
    import trio

    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(worker)


async def _asyncio_run_all(workers: list[Callable[[], Awaitable[None]]]) -> None:
    import asyncio

    await asyncio.gather(*(worker() for worker in workers))


def client_pairlink(phases: Phases, port: int) -> None:
    import trio

    from pairlink import connect

    async def main() -> None:
        async with connect(f"amqp://127.0.0.1:{port}") as conn:
            echo = await conn.service("echo")
            call = getattr(echo, phases.plan.operation)
            await _phases(phases, functools.partial(call, PAYLOAD), _trio_run_all)

    trio.run(main)


def client_grpc(phases: Phases, port: int) -> None:
    import asyncio

    import grpc

    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(GRPC_METHOD)
            await _phases(phases, functools.partial(stub, PAYLOAD), _asyncio_run_all)

    asyncio.run(main())


def client_proton(phases: Phases, port: int) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import AtMostOnce, Container

    plan = phases.plan

    class EchoClient(MessagingHandler):
        """Requests pre-settled on a sender to ``echo``, replies on a dynamic receiver."""

        def __init__(self) -> None:
            super().__init__(prefetch=PREFETCH, auto_accept=False, auto_settle=True)
            self.conn: Any = None
            self.sender: Any = None
            self.receiver: Any = None
            self.reply_to: str | None = None
            self.opened = 0
            self.ids = itertools.count(1)
            self.sent_at: dict[int, int] = {}
            self.phase = ""
            self.deadline = 0.0
            self.start = 0.0
            self.completed = 0
            self.latencies: list[int] = []

        def on_start(self, event: Any) -> None:
            container = event.container
            self.conn = container.connect(f"127.0.0.1:{port}", reconnect=False)
            self.sender = container.create_sender(self.conn, "echo", options=AtMostOnce())
            self.receiver = container.create_receiver(
                self.conn, None, dynamic=True, options=AtMostOnce()
            )

        def on_link_opened(self, event: Any) -> None:
            if event.link == self.receiver:
                self.reply_to = self.receiver.remote_source.address
            self.opened += 1
            if self.opened == 2:
                self._start("warmup", plan.warmup)

        def _send(self) -> None:
            message_id = next(self.ids)
            self.sent_at[message_id] = time.perf_counter_ns()
            self.sender.send(
                Message(
                    id=message_id,
                    reply_to=self.reply_to,
                    body=PAYLOAD,
                    inferred=True,
                    properties={"operation": "echo"},
                )
            )

        def _start(self, phase: str, seconds: float = 0.0) -> None:
            if phase != "warmup":
                phases.begin(phase)
            self.phase = phase
            self.completed = 0
            self.start = time.perf_counter()
            self.deadline = self.start + seconds
            for _ in range(1 if phase == "latency" else plan.inflight):
                self._send()

        def on_message(self, event: Any) -> None:
            event.delivery.settle()
            reply = event.message
            sent = self.sent_at.pop(reply.correlation_id)
            _check(reply.body)
            self.completed += 1
            if self.phase == "latency":
                self.latencies.append(time.perf_counter_ns() - sent)
                if self.completed < plan.latency_calls:
                    self._send()
                    return
            elif time.perf_counter() < self.deadline:
                self._send()
                return
            elif self.sent_at:
                return  # draining the calls still in flight
            self._phase_done()

        def _phase_done(self) -> None:
            elapsed = time.perf_counter() - self.start
            if self.phase == "warmup":
                self._start("throughput", plan.duration)
            elif self.phase == "throughput":
                phases.end("throughput", self.completed, elapsed, None)
                self._start("latency")
            else:
                phases.end("latency", self.completed, elapsed, self.latencies)
                phases.finish()
                self.conn.close()

        def on_connection_closed(self, event: Any) -> None:
            event.container.stop()

        def on_transport_error(self, event: Any) -> None:
            raise RuntimeError(f"proton client: {event.transport.condition}")

    Container(EchoClient()).run()


CLIENTS: dict[str, Callable[[Phases, int], None]] = {
    "pairlink": client_pairlink,
    "proton": client_proton,
    "grpc": client_grpc,
}


def run_child(role: str, stack: str, plan: Plan | None, profile_out: str | None) -> None:
    ctl = Control()
    if role == "server":
        SERVERS[stack](ServerControl(ctl, profile_out=profile_out))
        return
    assert plan is not None
    ctl.send(hello=stack)
    port = int(ctl.receive()["port"])
    CLIENTS[stack](Phases(ctl, plan), port)
