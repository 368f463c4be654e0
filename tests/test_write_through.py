"""Replies written by the task that read the request (``Writes.write_through``): a
reply the socket does not take at once goes out whole, and before anything queued after it.

A reply of a few MiB is more than a loopback socket takes in one non-blocking write, so the
writer sends the rest; one of 20 MiB is also past the connection's bound on bytes waiting for
the peer, so credit is held and reading stops meanwhile. Small calls pipelined behind it,
answered by the reader or by worker tasks (whose replies may be queued before the writer has
sent the rest), must get their own replies intact: a reordered or lost byte breaks the
framing, and the calls fail or time out."""

from __future__ import annotations

import trio

from pairlink import connect, handler, open_server, service

BIG = 3 << 20
"""Past what one write takes, within what the engine sends before the peer's next flow: the
rest waits for the writer while replies of other calls are queued behind it."""
ROUNDS = 20
HUGE = 20 << 20
"""Past the connection's bound on bytes waiting for the peer as well."""


@service("blobs")
class Blobs:
    @handler(inline=True)
    def blob(self, size: int) -> bytes:
        return b"x" * size

    @handler(inline=True)
    def echo(self, x: int) -> int:
        return x

    @handler
    async def later(self, x: int) -> int:  # answered by a worker task, not by the reader
        return x


async def test_a_reply_too_big_for_one_write_arrives_whole_and_in_order() -> None:
    async with (
        open_server(Blobs(), listen="amqp://127.0.0.1:0", grace=1) as server,
        connect(server.url, timeout=30) as client,
    ):
        blobs = await client.service("blobs")
        assert await blobs.echo(1) == 1  # the small path: one read, one write-through
        sizes: list[int] = []
        echoed: list[int] = []

        async def big() -> None:
            sizes.append(len(await blobs.blob(BIG)))

        async def small(i: int) -> None:
            echoed.append(await (blobs.echo(i) if i % 2 else blobs.later(i)))

        for _ in range(ROUNDS):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(big)
                for i in range(20):
                    nursery.start_soon(small, i)
        assert sizes == [BIG] * ROUNDS
        assert sorted(echoed) == sorted(list(range(20)) * ROUNDS)
        assert len(await blobs.blob(HUGE)) == HUGE
        assert await blobs.echo(2) == 2  # and the connection still serves
