"""A Trio run in a thread of its own, for synchronous code that needs one: the blocking client,
a server beside a Spark driver, a Spark task's calls.

``start_trio_thread(fn)`` runs ``fn`` in ``trio.run`` in a new daemon thread, the way
``nursery.start`` runs a task: it returns once ``fn`` has called ``task_status.started(value)``,
and a failure before that is raised in the caller's thread, as ``nursery.start`` raises it in
the caller's task. The caller then reaches into the run with ``run``/``run_sync`` (the
``trio.from_thread`` calls, given the run's token), cancels ``fn`` with ``stop``, or waits for
it to end with ``join``, which raises what ``fn`` raised.

The thread is a daemon, so a process that exits without stopping it is not held up. It belongs
to the process that started it: a child forked afterwards has the parent's memory of it but no
such thread, so a caller that keeps one across forks asks ``in_this_process`` and starts its
own in the child.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar, TypeVarTuple, cast, overload

import trio

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class Startable(Protocol[T_co]):
    """An async function started as ``nursery.start`` starts one: it calls
    ``task_status.started(value)`` once it is ready for the caller."""

    def __call__(self, *, task_status: trio.TaskStatus[T_co]) -> Awaitable[object]: ...


class TrioThread(Generic[T]):
    """A Trio run in a daemon thread, hosting one function; made by ``start_trio_thread``."""

    value: T
    """What the hosted function passed to ``task_status.started``."""
    token: trio.lowlevel.TrioToken

    def __init__(self, fn: Startable[T], name: str) -> None:
        self.name = name
        self.pid = os.getpid()
        self._ready = threading.Event()  # started, or ended before it
        self._started = False
        self._error: BaseException | None = None
        self._scope = trio.CancelScope()
        self._thread = threading.Thread(target=self._target, args=(fn,), name=name, daemon=True)

    @property
    def in_this_process(self) -> bool:
        """False in a child forked after the start: the thread is the parent's."""
        return self.pid == os.getpid()

    def run(self, afn: Callable[[*Ts], Awaitable[R]], *args: *Ts) -> R:
        """``await afn(*args)`` in the Trio thread; block until it is done and return (or
        raise) its outcome here. ``trio.RunFinishedError`` once the run has ended."""
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def run_sync(self, fn: Callable[[*Ts], R], *args: *Ts) -> R:
        """``fn(*args)`` in the Trio thread, as ``run`` does for an async function."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def stop(self) -> None:
        """Cancel the hosted function, unless it has ended, and wait for the thread to end.
        Raises nothing: ``join`` tells how the function ended."""
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._scope.cancel)
        self._thread.join()

    def join(self) -> None:
        """Wait for the hosted function to end (cancelled by ``stop``, or by itself); raise
        what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _target(self, fn: Startable[T]) -> None:
        try:
            trio.run(self._main, fn)
        except BaseException as exc:  # raised in the caller's thread, by start or join
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self, fn: Startable[T]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        with self._scope:
            await fn(task_status=_Status(self))

    def _start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if not self._started:
            self.join()  # raises the start-up failure
            raise RuntimeError(f"{self.name}: the function returned without calling started")

    def _set_started(self, value: T) -> None:
        if self._started:
            raise RuntimeError("called 'started' twice on the same task status")
        self.value = value
        self._started = True
        self._ready.set()


class _Status(trio.TaskStatus[T]):
    """The ``task_status`` a hosted function gets: ``started`` wakes the starting thread."""

    def __init__(self, host: TrioThread[T]) -> None:
        self._host = host

    @overload
    def started(self: _Status[None]) -> None: ...

    @overload
    def started(self, value: T) -> None: ...

    def started(self, value: T | None = None) -> None:
        # the default None comes only from a _Status[None]'s started() (the first overload)
        self._host._set_started(cast(T, value))


def start_trio_thread(fn: Startable[T], *, name: str) -> TrioThread[T]:
    """Run ``fn(task_status=...)`` in a new Trio run in a daemon thread named ``name``; return
    once it has called ``task_status.started(value)`` (``thread.value``). What it raised before
    that is raised here, once the thread has ended."""
    host = TrioThread(fn, name)
    host._start()
    return host
