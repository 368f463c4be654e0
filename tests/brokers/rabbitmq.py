"""A real RabbitMQ broker for the tests: Debian's ``rabbitmq-server`` (``make`` installs it)
with its AMQP 1.0 plugin, started as a process of the test run, on 127.0.0.1 only, with its
own folders, its own Erlang cookie and ports below 32768, and killed with its Erlang VM
when the run ends."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
"""Debian's rabbitmq-server script (the one in /usr/sbin insists on running as root's
``rabbitmq`` user); none of the tests need its CLI tools."""
STARTED = "Starting broker... completed"
"""The line the broker prints on standard output once it listens, plugins started."""
START_TIMEOUT = 60.0
"""Seconds a broker has to start (about 10 on the 2-core CI machine)."""


def missing() -> str | None:
    """Why no broker can be started here, or None."""
    if not SERVER.exists():
        return f"{SERVER} is missing: `make` installs rabbitmq-server (Debian's, apt)"
    return None


def low_port() -> int:
    """A free port below 32768 on 127.0.0.1 (the project's rule for fixed ports)."""
    for _ in range(200):
        port = random.randrange(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32768")


@attrs.frozen
class Broker:
    """A running broker: where to reach it, as user ``guest`` (password ``guest``)."""

    port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}"


@contextmanager
def rabbitmq(folder: Path) -> Iterator[Broker]:
    """Start a broker keeping its state in ``folder``; stop it (its script and Erlang VM, and
    the port mapper if it was ours) on the way out."""
    port, dist = low_port(), low_port()
    (folder / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
    (folder / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n"
    )
    env = {
        **os.environ,
        "HOME": str(folder),  # the Erlang cookie is written here
        "RABBITMQ_NODENAME": f"pairlink-{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_BASE": str(folder),
        "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(folder / "log"),
        "RABBITMQ_PID_FILE": str(folder / "pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
    }
    with _epmd():
        yield from _broker(folder, port, env)


def _broker(folder: Path, port: int, env: dict[str, str]) -> Iterator[Broker]:
    process = subprocess.Popen(
        [str(SERVER)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the script and its Erlang VM: one group to kill
    )
    try:
        _wait_started(process)
        yield Broker(port, folder)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


EPMD_PORT = 4369
"""Erlang's port mapper, which a broker registers its node with: shared by every Erlang VM
of the machine, on its fixed port."""


@contextmanager
def _epmd() -> Iterator[None]:
    """An Erlang port mapper for the broker's node: the machine's if one runs, else one of
    ours in the foreground, stopped afterwards (the broker would start one that daemonizes
    and outlives the tests)."""
    if _listening(EPMD_PORT):
        yield
        return
    epmd = subprocess.Popen(["epmd", "-address", "127.0.0.1"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(EPMD_PORT):  # it says nothing when ready: its port does
            if epmd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("epmd did not start")
            time.sleep(0.01)
        yield
    finally:
        epmd.kill()
        epmd.wait()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_started(process: subprocess.Popen[str]) -> None:
    """Read the broker's output until it says it started (its lines kept for the error)."""
    seen: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if STARTED in line:
                started.set()
        started.set()  # it ended: the wait below says how

    threading.Thread(target=read, daemon=True).start()
    started.wait(START_TIMEOUT)
    if not any(STARTED in line for line in seen):
        raise RuntimeError(f"RabbitMQ did not start: {''.join(seen[-20:])}")
