"""Calls whose requests wait in the pair's line for credit (``Sender.send_or_queue``): no task
waits to send them, each caller waits once for its reply. Real TCP on 127.0.0.1, against our own
service (whose mailbox grants less credit than there are callers) and the raw engine server."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pairlink import connect, handler, open_server, service
from pairlink._amqp import errors as conditions
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Error
from pairlink._amqp.performatives import Transfer
from pairlink._io.links import Pending, Sender
from pairlink.errors import LinkDetachedError, MessageTooLargeError
from tests.client_peers import Incoming, RawPeer, raw_server


def nothing(_incoming: Incoming) -> None:
    """An ``on_request`` that leaves every request for the test to answer."""


@service("narrow", max_concurrency=2, mailbox=4)
class Narrow:
    """Holds four calls at most: 40 pipelined callers mostly wait in the line for credit."""

    @handler
    async def echo(self, x: int) -> int:
        await trio.lowlevel.checkpoint()  # answers come back in another order than calls went
        return x


def _sender(client: object, address: str) -> Sender:
    conn = client._conn  # type: ignore[attr-defined]  # white box: the pair's line
    return conn.pairs[address].sender  # type: ignore[no-any-return]


async def test_pipelined_callers_beyond_the_credit_each_get_their_own_reply() -> None:
    queued = 0
    async with (
        open_server(Narrow, listen="amqp://127.0.0.1:0") as server,
        connect(server.url, timeout=30) as client,
    ):
        narrow = await client.service("narrow")
        assert await narrow.echo(-1) == -1
        line = _sender(client, "narrow")
        send_or_queue = line.send_or_queue

        def counting(pending: Pending, **options: bool) -> bool:
            nonlocal queued
            sent = send_or_queue(pending, **options)
            queued += not sent
            return sent

        line.send_or_queue = counting  # type: ignore[method-assign]
        results: dict[int, int] = {}

        async def caller(n: int) -> None:
            for k in range(5):
                results[n * 5 + k] = await narrow.echo(n * 5 + k)

        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(caller, n)
        assert results == {i: i for i in range(200)}
        assert queued > 0  # the line was used, not only credit at hand
        assert line.waiting == 0 and client.in_flight() == 0
        assert client.late_replies == 0


async def test_a_call_cancelled_in_line_never_leaves_and_a_late_reply_is_dropped() -> None:
    """One credit: the first call takes it, the second waits in line. Cancelled there, the
    second never leaves, even when credit comes; the first, cancelled after its request left,
    drops its reply when it comes; the next call goes and gets its own reply."""
    async with (
        raw_server(credit=1, on_request=nothing) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        first, second = trio.CancelScope(), trio.CancelScope()

        async def call(name: str, scope: trio.CancelScope) -> None:
            with scope:
                await client.call("calc", name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "first", first)
            await server.connected.wait()
            peer = server.peers[0]
            await peer.wait_for(Transfer, 1)
            nursery.start_soon(call, "second", second)
            await trio.testing.wait_all_tasks_blocked()
            assert _sender(client, "calc").waiting == 1
            second.cancel()
            first.cancel()
        assert first.cancelled_caught and second.cancelled_caught
        assert _sender(client, "calc").waiting == 0 and client.in_flight("calc") == 0
        peer.incoming[0].reply("nobody waits")
        peer.engine.flow(peer.incoming[0].link, 1)
        peer.kick()

        async def answer_third() -> None:
            await peer.wait_for(Transfer, 2)
            peer.incoming[1].reply("third's")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_third)
            assert await client.call("calc", "third") == "third's"
        assert [i.request.operation for i in peer.incoming] == ["first", "third"]
        assert client.late_replies == 1


async def test_a_detach_fails_the_calls_in_line_at_once() -> None:
    """The service detaches the pair while calls wait in line for credit: every one fails
    with the detach's condition at once, none of them sent."""
    async with (
        raw_server(credit=1, on_request=nothing) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        errors: list[str | None] = []

        async def call(n: int) -> None:
            with pytest.raises(LinkDetachedError) as exc:
                await client.call("calc", "add", n)
            errors.append(exc.value.condition)

        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(call, n)
            await server.connected.wait()
            peer = server.peers[0]
            await peer.wait_for(Transfer, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert _sender(client, "calc").waiting == 3
            incoming = peer.incoming[0]
            peer.engine.detach(incoming.link, error=Error(condition=conditions.RESOURCE_DELETED))
            peer.kick()
        assert errors == [conditions.RESOURCE_DELETED] * 4
        assert len(peer.incoming) == 1 and client.in_flight() == 0


def small_messages(peer: RawPeer, link: Link) -> None:
    """Answer as a pairing responder that takes requests of 1000 bytes at most."""
    peer.engine.answer_attach(
        link,
        source=link.remote_source,
        target=link.remote_target,
        properties=link.remote_properties,
        max_message_size=1000 if link.is_receiver else None,
    )
    if link.is_receiver:
        peer.engine.flow(link, peer.server.credit)


async def test_a_request_too_large_fails_its_call_when_its_turn_comes() -> None:
    """A request that waited in line and is too large for the peer fails its own call with
    ``MessageTooLargeError`` when credit comes; the call behind it goes."""
    async with (
        raw_server(credit=1, answer=small_messages) as server,
        connect(server.url, sasl=False, timeout=5) as client,
    ):
        assert await client.call("calc", "add", 1, 2) == 3  # the one credit, used up
        peer = server.peers[0]
        results: list[object] = []

        async def call(value: bytes) -> None:
            try:
                results.append(await client.call("calc", "echo", value))
            except MessageTooLargeError as exc:
                results.append(type(exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, b"x" * 2000)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, b"small")
            await trio.testing.wait_all_tasks_blocked()
            assert _sender(client, "calc").waiting == 2
            link = peer.incoming[0].link
            peer.engine.flow(link, link.link_credit + 1)
            peer.kick()
        assert results == [MessageTooLargeError, b"small"]
        assert [i.request.operation for i in peer.incoming] == ["add", "echo"]


async def test_a_sequential_call_is_written_by_its_caller_without_waking_the_writer() -> None:
    """One call at a time on a pair: each request goes to the socket from the calling task
    (the writer is not woken); under pipelining the writer sends them (in batches)."""
    async with (
        open_server(Narrow, listen="amqp://127.0.0.1:0") as server,
        connect(server.url, timeout=30) as client,
    ):
        narrow = await client.service("narrow")
        assert await narrow.echo(0) == 0  # the pair's attaches: the writer sends them
        amqp = client._conn.amqp if client._conn else None
        assert amqp is not None
        writes = amqp._writes
        kicks = 0
        kick = writes.kick

        def counting() -> None:  # white box: a kick with none pending wakes the writer
            nonlocal kicks
            kicks += not writes.kicked
            kick()

        writes.kick = counting  # type: ignore[method-assign]
        for n in range(1, 20):
            assert await narrow.echo(n) == n
        assert kicks == 0
        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(narrow.echo, n)
        assert kicks > 0
