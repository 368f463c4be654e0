"""A Spark standalone cluster (a master and one worker) and a Spark Connect server on it, from
the installed pyspark's ``spark-class``/``spark-submit``, bound to 127.0.0.1 on ports of the
system's choosing, for the tests that kill an executor or a Python worker mid-job.

Each process starts in a session of its own: the executors its worker launches and their Python
daemons and workers stay in that session (the daemon makes a process group, not a session), so
``stop`` finds and ends every process a test started, by PID, even after a parent died first.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs

BIN = Path(sys.executable).parent
"""Where the installed pyspark put ``spark-class`` and ``spark-submit``."""
ROOT = Path(__file__).resolve().parents[2]
STARTUP = 90.0
"""Seconds a JVM may take to say it is up (~2-12 s here; more on a loaded 2-core CI runner)."""
MASTER_CONF = "spark.master.rest.enabled false\n"
"""The master's REST submission server listens on the fixed port 6066: off, as the tests do not
submit through it and parallel runs would share the port."""
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Every JVM here lives for seconds on a 2-core machine: the quick compiler only and one GC
thread leave the cores to the job (a trivial ``spark-submit`` job here: 24 s without, 14 s with,
medians of 3 under load)."""
APP_CONF = (
    *("--driver-java-options", JVM_OPTIONS),
    *("--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}"),
    *("--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false"),
)
"""An application's settings: an executor of 512 MiB (the default 1 GiB is more than the tests
need on a shared machine) and no web UI."""
EXECUTOR = "CoarseGrainedExecutorBackend"
"""The class of an executor's JVM in its command line."""


def environment() -> dict[str, str]:
    """Every Spark process's environment: 127.0.0.1 only, this interpreter for the Python
    workers, and this checkout's pairlink and tests first on the path (the virtualenv's
    editable install may point at another checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "MASTER")}
    path = [str(ROOT / "framework"), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(path),
        SPARK_DAEMON_JAVA_OPTS=JVM_OPTIONS,  # the master's and the worker's
    )
    return env


@attrs.frozen
class Stat:
    """What ``/proc/<pid>/stat`` and ``cmdline`` say of a live process."""

    pid: int
    ppid: int
    session: int
    command: str


def processes() -> list[Stat]:
    """Every live process (zombies are dead, only not reaped yet)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # it ended meanwhile
            continue
        state, ppid, _, session = stat[stat.rindex(")") + 2 :].split()[:4]
        if state not in "ZX":
            found.append(Stat(int(entry.name), int(ppid), int(session), command))
    return found


def kill(pid: int, within: float = 30.0) -> None:
    """SIGKILL ``pid`` and wait until it has died; AssertionError if there was no such process
    or it outlived ``within``. A pidfd makes both race-free and the wait an event."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        raise AssertionError(f"no process {pid} to kill") from None
    try:
        signal.pidfd_send_signal(handle, signal.SIGKILL)
        died, _, _ = select.select([handle], [], [], within)
        assert died, f"process {pid} still alive {within} s after SIGKILL"
    finally:
        os.close(handle)


class Process:
    """A Spark process (a JVM, a driver) started in a session of its own; its output (stdout
    and stderr, one stream) is read line by line, so a test can wait for the line it awaits."""

    def __init__(self, name: str, command: list[str], cwd: Path) -> None:
        self.name = name
        self.popen = subprocess.Popen(
            command,
            cwd=cwd,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.ended = False
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:
            for line in self.popen.stdout:
                with self.changed:
                    self.lines.append(line)
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def expect(self, pattern: str, within: float = STARTUP) -> re.Match[str]:
        """The first line matching ``pattern``, waited for up to ``within`` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + within
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if found := regex.search(line):
                        return found
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.ended or left <= 0:
                    why = "ended" if self.ended else f"said nothing like it in {within} s"
                    tail = "".join(self.lines[-40:])
                    raise AssertionError(f"{self.name} {why}, waiting for {pattern!r}:\n{tail}")
                self.changed.wait(left)

    def wait(self, within: float) -> int:
        """Its exit status, once it has ended (within ``within`` seconds)."""
        status = self.popen.wait(within)
        self.reader.join()
        return status

    def members(self) -> list[Stat]:
        """The live processes of this one's session: it, and all it started."""
        return [stat for stat in processes() if stat.session == self.popen.pid]

    def stop(self) -> None:
        """SIGKILL every process of the session (this one first: a worker would launch a new
        executor for one killed) until none is left, and reap this one."""
        while members := self.members():
            for stat in sorted(members, key=lambda stat: stat.pid != self.popen.pid):
                with contextlib.suppress(AssertionError):  # it ended meanwhile
                    kill(stat.pid)
        self.popen.wait()
        self.reader.join()


@attrs.frozen
class Cluster:
    """A running standalone master (its ``spark://`` URL) and its one worker."""

    url: str
    master: Process
    worker: Process
    folder: Path

    def executors(self) -> list[int]:
        """The PIDs of the executor JVMs the worker runs now."""
        return [
            stat.pid
            for stat in self.worker.members()
            if stat.ppid == self.worker.popen.pid and EXECUTOR in stat.command
        ]

    def python_workers(self) -> list[int]:
        """The PIDs of the Python workers the executors' daemons have forked (each runs one task
        at a time; the daemon itself is their parent)."""
        members = self.worker.members()
        executors = set(self.executors())
        daemons = {stat.pid for stat in members if stat.ppid in executors}
        return [stat.pid for stat in members if stat.ppid in daemons]


def started(stack: ExitStack, folder: Path, name: str, command: list[str]) -> Process:
    """A ``Process`` running ``command`` in ``folder``, stopped when ``stack`` closes."""
    process = Process(name, command, folder)
    stack.callback(process.stop)
    return process


@contextmanager
def standalone(folder: Path, cores: int = 2) -> Iterator[Cluster]:
    """A master and a worker of ``cores`` cores, registered with it, in ``folder`` (their work
    directory); both ended, with everything they started, on leaving."""
    conf = folder / "master.conf"
    conf.write_text(MASTER_CONF)
    spark_class = str(BIN / "spark-class")
    here = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
    resources = ["--cores", str(cores), "--memory", "2g", "--work-dir", str(folder / "work")]
    with ExitStack() as stack:
        master = started(
            stack,
            folder,
            "the master",
            [spark_class, MASTER, *here, "--properties-file", str(conf)],
        )
        url = master.expect(r"Starting Spark master at (spark://\S+)")[1]
        worker = started(
            stack,
            folder,
            "the worker",
            [spark_class, WORKER, url, *here, *resources],
        )
        worker.expect("Successfully registered with master")
        yield Cluster(url, master, worker, folder)


def submit(stack: ExitStack, folder: Path, name: str, master: str, *args: str) -> Process:
    """``spark-submit --master master args``, with the settings of every application here."""
    command = [str(BIN / "spark-submit"), "--master", master, "--name", name, *APP_CONF, *args]
    return started(stack, folder, name, command)


@contextmanager
def connect_server(cluster: Cluster) -> Iterator[str]:
    """A Spark Connect server whose application runs on ``cluster``: its ``sc://`` URL."""
    with ExitStack() as stack:
        server = submit(
            stack,
            cluster.folder,
            "pairlink-connect",
            cluster.url,
            "--class",
            CONNECT_SERVER,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.connect.grpc.binding.port=0",
        )
        yield "sc://" + server.expect(r"Spark Connect server started at: (\S+)")[1]
