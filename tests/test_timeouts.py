"""The client's one-task timeouts: waiters wake at their deadline, never before, never twice."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from pairlink._client.timeouts import Timeouts


@attrs.define(eq=False)
class Waiter:
    deadline: float
    woken: list[float] = attrs.field(factory=list)

    def expire(self) -> None:
        self.woken.append(trio.current_time())


async def test_waiters_expire_at_their_deadlines_whatever_order_they_came_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeouts = Timeouts()
    late, early, answered = Waiter(10.0), Waiter(3.0), Waiter(1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timeouts.run)
        timeouts.add(late)
        await trio.sleep(1)
        timeouts.add(early)  # earlier than what the task sleeps towards: it re-arms
        timeouts.add(answered)
        timeouts.discard(answered)  # its reply came: it must not be woken
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert early.woken == [3.0]
    assert late.woken == [10.0]
    assert answered.woken == []


async def test_a_deadline_already_passed_expires_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeouts = Timeouts()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timeouts.run)
        await trio.sleep(5)
        waiter = Waiter(1.0)
        timeouts.add(waiter)
        await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert waiter.woken == [5.0]
