"""Deadlines on a replaceable wall clock: what a served call has left, what an inner call gets."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from pairlink._rpc import deadline


def test_the_wall_clock_is_replaced_for_the_block_and_restored_after() -> None:
    with deadline.wall_clock(lambda: 100.0):
        assert deadline.wall_time() == 100.0
        with pytest.raises(KeyError), deadline.wall_clock(lambda: 5.0):
            assert deadline.wall_time() == 5.0
            raise KeyError("restored all the same")
        assert deadline.wall_time() == 100.0
    assert deadline.wall_time() == pytest.approx(time.time(), abs=1)


def test_an_inner_call_gets_what_is_left_of_the_served_deadline() -> None:
    with deadline.wall_clock(lambda: 100.0):
        assert deadline.remaining() is None  # serving nothing: the call's own timeout
        assert deadline.effective_timeout(7.0) == 7.0
        with deadline.serving(103.0):
            assert deadline.remaining() == 3.0
            assert deadline.effective_timeout(10.0) == 3.0
            assert deadline.effective_timeout(2.0) == 2.0
            assert deadline.effective_timeout(None) == 3.0
            with deadline.serving(None):  # a call without a deadline, served inside
                assert deadline.effective_timeout(None) is None
            assert deadline.remaining() == 3.0
        with deadline.serving(99.0):
            assert deadline.remaining() == -1.0  # passed: the client sends nothing
        assert deadline.remaining() is None


async def test_deadlines_follow_a_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    with deadline.serving(deadline.wall_time() + 5):
        await trio.sleep(2)  # on the mock clock: no real time passes
        assert deadline.remaining() == pytest.approx(3)
