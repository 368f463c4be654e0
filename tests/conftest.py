"""Project-wide test fixtures and the per-test deadline for Trio tests.

Deadlines, two layers, so that a hang fails one test instead of eating CI's time:

* pytest-timeout (``timeout`` in pyproject.toml, or ``@pytest.mark.timeout(N)``) guards every
  test. Its default SIGALRM method raises inside whatever is running; inside ``trio.run`` that
  leaves Trio's run state broken and every later async test fails with "Attempted to call run()
  from inside a run()". So for Trio tests:
* the test runs under a cancel scope that a real-time watchdog thread cancels at the same
  deadline, reported as ``TimeoutError`` (Trio's clock may be a mock clock, so the watchdog does
  not use it). Only if the test cannot be cancelled (a shielded wait, a blocking call in the
  event loop) does pytest-timeout fire, GRACE seconds later, in ``thread`` mode: it dumps every
  thread's stack and ends the run, which beats a cascade of misleading failures.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio
import trio.testing

from pairlink._amqp.fast_paths import FAST_PATHS
from pairlink._rpc import deadline
from tests.interop.proton_server import prepare_cyrus
from tests.tls import TlsFiles, make_tls_files

GRACE = 15.0
"""Seconds between a Trio test's cancellation and pytest-timeout's hard stop."""


def _test_deadline(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:  # --timeout on the command line, else the ini setting (as pytest-timeout reads them)
        value = item.config.getoption("timeout", None)
        if value is None:
            value = item.config.getini("timeout")
    seconds = float(value) if value not in (None, "") else 0.0
    return seconds if seconds > 0 else None


def _run_with_deadline(deadline: float, nodeid: str) -> Callable[..., Any]:
    """A ``trio.run`` replacement that cancels the test after ``deadline`` real seconds."""

    def run(async_fn: Callable[[], Awaitable[Any]], **run_kwargs: Any) -> Any:
        async def guarded() -> Any:
            token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                timer = threading.Timer(deadline, token.run_sync_soon, args=(scope.cancel,))
                timer.daemon = True
                timer.start()
                try:
                    return await async_fn()
                finally:
                    timer.cancel()
            if scope.cancelled_caught:
                raise TimeoutError(f"{nodeid} did not finish within {deadline:g} s")
            return None

        return trio.run(guarded, **run_kwargs)

    return run


def pytest_configure(config: pytest.Config) -> None:
    # Cyrus SASL takes its configuration from the first Proton server transport of the process,
    # whichever test creates it: have the interop harness's (PLAIN users in a sasldb) in place.
    prepare_cyrus()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Runs after pytest-trio's own hook has marked the async tests with `trio`.
    for item in items:
        trio_marker = item.get_closest_marker("trio")
        deadline = _test_deadline(item)
        if trio_marker is None or deadline is None:
            continue
        if trio_marker.kwargs.get("run", trio.run) is not trio.run:
            continue  # a test that chose its own runner keeps it
        # pytest-trio reads the first `trio` marker's `run`: prepend ours.
        item.add_marker(pytest.mark.trio(run=_run_with_deadline(deadline, item.nodeid)), False)
        item.add_marker(pytest.mark.timeout(deadline + GRACE, method="thread"), False)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """One trustme CA with server (127.0.0.1, localhost) and client certificates, as PEM files."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# -- mock clocks that deadlines follow -------------------------------------------------------

WALL_EPOCH = 1_700_000_000.0
"""The wall clock of a mock-clock test at Trio time 0. Fixed and years from today, so that a
deadline stamped from the real clock instead fails the test rather than passing by luck."""

IO_AUTOJUMP = 0.05
"""Real seconds the whole process must be idle before ``io_clock`` jumps: long enough that bytes
on their way through the loopback are never overtaken by a jump, short enough to be cheap."""


def _deadlines_follow(clock: trio.testing.MockClock) -> Iterator[trio.testing.MockClock]:
    """``clock``, with the wall clock of deadlines (``pairlink._rpc.deadline``) reading it."""
    with deadline.wall_clock(lambda: WALL_EPOCH + clock.current_time()):
        yield clock


@pytest.fixture
def mock_clock() -> Iterator[trio.testing.MockClock]:
    """pytest-trio's ``mock_clock``, which deadlines (wire expiry times, 408s) follow too."""
    yield from _deadlines_follow(trio.testing.MockClock())


@pytest.fixture
def autojump_clock() -> Iterator[trio.testing.MockClock]:
    """pytest-trio's ``autojump_clock`` (jumps as soon as every task waits), which deadlines
    follow too. For tests without sockets: over TCP, see ``io_clock``."""
    yield from _deadlines_follow(trio.testing.MockClock(autojump_threshold=0))


@pytest.fixture
def io_clock() -> Iterator[trio.testing.MockClock]:
    """An autojumping mock clock for tests over real sockets, which deadlines follow. Trio counts
    a task waiting for a socket as blocked, so a clock that jumps at once could jump past a
    deadline while a request is still in the kernel; this one waits ``IO_AUTOJUMP`` first."""
    yield from _deadlines_follow(trio.testing.MockClock(autojump_threshold=IO_AUTOJUMP))


@pytest.fixture
def fast_reads() -> Iterator[Callable[[str], list[bool]]]:
    """``fast_reads("request")``: from then on, whether each read by that fast path (its name
    in ``pairlink._amqp.fast_paths.FAST_PATHS``) took its input (True) or left it to the
    general path."""
    with contextlib.ExitStack() as stack:
        yield lambda name: stack.enter_context(FAST_PATHS[name].recorded())
