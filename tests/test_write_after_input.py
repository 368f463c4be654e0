"""Bytes an input gives other connections to send (a gateway relaying a message from one
connection to the next) are written through once that input is dispatched, not by waking
each connection's writer task (``Writes.kick`` while a reader dispatches an input: the Trio
run's ``AfterInput`` record, :mod:`pairlink._io.writes`)."""

from __future__ import annotations

import trio

from pairlink import connect
from tests.gateway.chain import CLIENT_ID, PUBLIC, open_chain

CALLS = 40


class WriterSteps(trio.abc.Instrument):
    """Counts the task steps of connection writers (``Writes._write_loop``)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("._write_loop"):
            self.steps += 1


async def test_a_relayed_message_goes_out_without_waking_the_next_connections_writer() -> None:
    async with open_chain() as chain, connect(chain.url, container_id=CLIENT_ID) as client:
        assert await client.call(PUBLIC, "echo", "warm-up") == "warm-up"
        writers = WriterSteps()
        trio.lowlevel.add_instrument(writers)
        try:
            for i in range(CALLS):
                assert await client.call(PUBLIC, "echo", i) == i
        finally:
            trio.lowlevel.remove_instrument(writers)
    # Each call crosses two gateways both ways: four relayed messages, and every one woke the
    # next connection's writer (and its answer, a flow, another): 8 writer steps per call
    # before. Left: at most a credit top-up of the service, sent by its granter task.
    assert writers.steps <= 2, writers.steps
