"""Bytes an input gives other connections to send (a gateway relaying a message from one
connection to the next) are written through once that input is dispatched, not by waking
each connection's writer task (``Writes.kick`` while a reader dispatches an input: the Trio
run's ``AfterInput`` record, :mod:`pairlink._io.writes`)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import trio

from pairlink import connect
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Accepted, Message
from pairlink._io import net
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import LinkEnd, LinkOwner, accept, open_sender
from pairlink._io.listener import listen
from pairlink._io.writes import AfterInput, after_input
from tests.gateway.chain import CLIENT_ID, PUBLIC, open_chain
from tests.listening import answering

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


def test_each_trio_run_keeps_its_own_record_of_the_connections_kicked_during_an_input() -> None:
    """The record is per Trio run, not per thread or process. While a reader of one run (in
    its own thread) is in the middle of dispatching an input, a connection of another run
    (another thread, as the blocking client's) that is kicked must go out through its own
    writer at once: noted in the first run's record, it would wait for that input to end (here
    never, as that input waits for it) or be written from the wrong thread."""
    mid_input = threading.Event()  # run A's server is dispatching an input: its record is open
    b_sent = threading.Event()
    seen: dict[str, object] = {}
    failures: list[BaseException] = []

    class Holder(LinkOwner):
        def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
            seen["a_open_record"] = after_input().kicked is not None
            mid_input.set()
            seen["b_in_time"] = b_sent.wait(10)  # blocks this run's thread, on purpose

    class Settler(LinkOwner):
        def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
            end.conn.settle(delivery, Accepted())

    def receiving(owner: LinkOwner) -> Callable[[AmqpConnection, Link], None]:
        def on_attach(conn: AmqpConnection, link: Link) -> None:
            accept(conn, link, owner)
            conn.flow(link, 10)

        return on_attach

    async def run_a() -> None:
        seen["a"] = after_input()
        async with (
            listen("amqp://127.0.0.1:0", accept=answering(receiving(Holder()))) as listener,
            net.connect(listener.url) as conn,
        ):
            sender = open_sender(conn, "held")
            await sender.send(Message(body="hold"), settled=True)
            await trio.to_thread.run_sync(mid_input.wait, 10)

    async def run_b() -> None:
        seen["b"] = after_input()
        async with (
            listen("amqp://127.0.0.1:0", accept=answering(receiving(Settler()))) as listener,
            net.connect(listener.url) as conn,
        ):
            sender = open_sender(conn, "q")
            await sender.take_credit()  # attached, with credit: the send below goes at once
            await trio.to_thread.run_sync(mid_input.wait, 10)
            seen["b_open_record"] = after_input().kicked is not None
            try:
                with trio.fail_after(5):
                    delivery = await sender.send(Message(body="while A is mid-input"))
            finally:
                b_sent.set()
            seen["b_outcome"] = delivery.remote_state

    def in_thread(main: Callable[[], Awaitable[None]]) -> threading.Thread:
        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:
                failures.append(exc)
                mid_input.set()
                b_sent.set()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = [in_thread(run_a), in_thread(run_b)]
    for thread in threads:
        thread.join(30)
    assert not failures, failures
    assert seen["a"] is not seen["b"]
    assert seen["a_open_record"] is True and seen["b_open_record"] is False
    assert seen["b_in_time"] is True
    assert isinstance(seen["b_outcome"], Accepted)

    async def record() -> AfterInput:
        return after_input()

    assert trio.run(record) is not trio.run(record)  # one run after another: not per thread
