"""A service's own threads for its plain ``def`` handlers: long-lived, fed from a queue, their
results handed back to the event loop in batches.

``trio.to_thread.run_sync`` costs, per call, a limiter, a hand-off to a cached thread and a wake-up
of the event loop (a socket write) for the result, besides the task that awaits it: with quick
handlers under load, four to five times what an inline handler costs. Here instead:

* a job goes on a queue, and a thread is woken only when none is awake between jobs to take it:
  a thread that finishes one takes the next without any wake-up. A thread taking a job while
  others wait wakes one more, so that a handler that blocks never holds the queue back (a
  pool that waited to see the queue stall first would run handlers that block for less than
  its wait one at a time);
* results collect on the threads' side and go back to the event loop in batches: one
  ``run_sync_soon`` carries every result that finished before the loop got to the first.

At most ``limit`` threads, started on demand and kept until the pool stops. The owner keeps no
more than ``limit`` jobs outstanding (the actor's ``max_concurrency``), so a job never waits for
a thread for long. Threads are daemons: a handler that never returns does not keep the process
alive.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio
from sniffio import current_async_library_cvar

from pairlink._telemetry.logs import get_logger

log = get_logger("pairlink.service")

A = TypeVar("A")
R = TypeVar("R")
Result = outcome.Value[R] | outcome.Error
"""A job's outcome: what its work returned, or what it raised."""
_Job = tuple[Callable[[Any], object], Any, Callable[[Any, Any], None], contextvars.Context | None]
"""A job as the queue holds it, its types erased: jobs of any argument and result share the
queue, and :meth:`ThreadPool.submit` checks each one's parts against each other."""


class ThreadPool:
    """Up to ``limit`` threads running jobs; each job's outcome is handed to its ``done`` in
    the event loop of the run that :meth:`run` serves."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        self.name = name
        self.outstanding = 0  # jobs submitted whose outcome was not delivered yet (loop side)
        self._jobs: deque[_Job] = deque()
        self._results: deque[tuple[Callable[[Any, Any], None], object, Result[object]]] = deque()
        self._delivery_due = False  # a _deliver is scheduled and has not started yet
        self._lock = threading.Lock()  # guards the four below
        self._awake = 0  # threads between jobs, or woken to look for one
        self._parked: list[threading.Lock] = []  # idle threads' wake-ups (held: released to wake)
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._context = contextvars.Context()
        self._stopped = trio.Event()  # stop() was called, or run() cancelled
        self._idle = trio.Event()  # set when the last outstanding outcome is delivered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve this run: deliver outcomes to it, and once :meth:`stop` is called (or this is
        cancelled) and every outcome is in, end the threads (waited for even when cancelled: a
        thread cannot be). Jobs submitted without a context of their own run in a copy of
        this task's (as ``to_thread`` would copy it)."""
        self._token = trio.lowlevel.current_trio_token()
        self._context = contextvars.copy_context()
        # as trio.to_thread: code in the thread must not think it runs under an async library
        self._context.run(current_async_library_cvar.set, None)
        task_status.started()
        try:
            await self._stopped.wait()
        finally:
            with trio.CancelScope(shield=True):
                while self.outstanding:
                    self._idle = trio.Event()
                    await self._idle.wait()
            self._close()

    def stop(self) -> None:
        """No more jobs will come: :meth:`run` ends once every outcome has been delivered."""
        self._stopped.set()

    def submit(
        self,
        work: Callable[[A], R],
        arg: A,
        done: Callable[[A, Result[R]], None],
        context: contextvars.Context | None = None,
    ) -> None:
        """Run ``work(arg)`` in a thread, in ``context`` (default: a fresh copy of the bound
        one), then ``done(arg, outcome)`` in the event loop."""
        self.outstanding += 1
        self._jobs.append((work, arg, done, context))
        self._wake()

    async def run_sync(self, fn: Callable[[], R]) -> R:
        """``fn()`` in a thread, in a copy of this task's context; like ``trio.to_thread.
        run_sync`` (not abandoned on cancel: a thread cannot be interrupted)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        context = contextvars.copy_context()
        context.run(current_async_library_cvar.set, None)
        self.submit(_call, fn, lambda _, result: trio.lowlevel.reschedule(task, result), context)
        value: R = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return value

    def _wake(self) -> None:
        """Make sure a thread will look at the queue: one is awake between jobs already, or
        wake a parked one, or start one if there are fewer than ``limit``."""
        with self._lock:
            if self._awake or self._closed:
                return
            if self._parked:
                self._awake += 1
                self._parked.pop().release()
                return
            if len(self._threads) >= self.limit:
                return  # all are running jobs: the first to finish takes it
            self._awake += 1
            thread = threading.Thread(
                target=self._serve, name=f"pairlink-{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _close(self) -> None:
        """End the threads (every outcome delivered: each is idle, or about to be)."""
        with self._lock:
            self._closed = True
            for wake in self._parked:
                self._awake += 1
                wake.release()
            self._parked.clear()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()

    def _serve(self) -> None:
        """A thread: take jobs until the queue is empty, then park until woken."""
        token = self._token
        assert token is not None, "run() comes before the first submit()"
        jobs, results, lock = self._jobs, self._results, self._lock
        wake = threading.Lock()
        wake.acquire()
        while True:
            try:
                work, arg, done, context = jobs.popleft()
            except IndexError:
                with lock:
                    if jobs:  # submitted after the popleft: its submitter saw us awake
                        continue
                    self._awake -= 1
                    if self._closed:
                        return
                    self._parked.append(wake)
                wake.acquire()
                continue
            with lock:
                self._awake -= 1
                more = bool(jobs) and not self._awake
            if more:  # this job may block: another thread takes the next
                self._wake()
            if context is None:
                context = self._context.copy()
            result = outcome.capture(context.run, work, arg)
            with lock:
                self._awake += 1  # before the result shows: an outstanding job has a thread
            results.append((done, arg, result))
            if not self._delivery_due:
                self._delivery_due = True
                # a RunFinishedError: the run is over, nobody is waiting any more
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._deliver)

    def _deliver(self) -> None:
        """In the event loop: every result that has come in, to its ``done``."""
        self._delivery_due = False  # first: a result that comes in from now on schedules anew
        results = self._results
        while results:
            done, arg, result = results.popleft()
            self.outstanding -= 1
            try:
                done(arg, result)
            except Exception as exc:  # raised here, it would crash the whole Trio run
                log.error("thread.undelivered", pool=self.name, error=repr(exc), exc_info=exc)
        if not self.outstanding:
            self._idle.set()


def _call(fn: Callable[[], R]) -> R:
    return fn()
