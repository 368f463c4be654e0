"""A plain TCP connection's socket read and written directly (``pairlink._io.plain_socket``):
the same bytes, ends and errors as Trio's stream over it, and calls answered alike whether a
connection reads its socket directly (plain TCP) or through its stream (TLS, in memory)."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from pairlink import connect, handler, open_server, service
from pairlink._client.client import Client
from pairlink._io import plain_socket
from pairlink._io.inputs import READ_SIZE
from tests.tls import TlsFiles


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[trio.socket.SocketType, trio.SocketStream]]:
    """Two ends of a real TCP connection on 127.0.0.1: a raw Trio socket and a stream."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        port = listeners[0].socket.getsockname()[1]
        async with await trio.open_tcp_stream("127.0.0.1", port) as theirs:
            ours = await listeners[0].accept()
            async with ours:
                yield ours.socket, theirs


async def test_receive_waits_for_bytes_then_returns_them() -> None:
    async with tcp_pair() as (sock, peer), trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await plain_socket.receive(sock, READ_SIZE))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing to read yet: it waits, it does not spin
        await peer.send_all(b"request")
    assert got == [b"request"]


async def test_receive_reads_at_most_size_and_the_rest_next_time() -> None:
    async with tcp_pair() as (sock, peer):
        await peer.send_all(b"abcdef")
        await trio.testing.wait_all_tasks_blocked()
        assert await plain_socket.receive(sock, 4) == b"abcd"
        assert await plain_socket.receive(sock, 4) == b"ef"


async def test_receive_is_a_checkpoint_even_with_bytes_waiting() -> None:
    async with tcp_pair() as (sock, peer):
        await peer.send_all(b"x")
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await plain_socket.receive(sock, READ_SIZE)
        assert scope.cancelled_caught  # cancellable like receive_some: the bytes stay unread
        assert await plain_socket.receive(sock, READ_SIZE) == b"x"


async def test_receive_returns_empty_at_the_peers_eof() -> None:
    async with tcp_pair() as (sock, peer):
        await peer.aclose()
        assert await plain_socket.receive(sock, READ_SIZE) == b""


async def test_a_reset_is_broken_and_a_closed_socket_is_closed() -> None:
    async with tcp_pair() as (sock, peer):
        # SO_LINGER 0: the close is a reset
        peer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.socket.close()
        with pytest.raises(trio.BrokenResourceError):
            await plain_socket.receive(sock, READ_SIZE)
        sock.close()
        with pytest.raises(trio.ClosedResourceError):
            await plain_socket.receive(sock, READ_SIZE)


async def test_closing_the_socket_wakes_a_waiting_receive_with_closed() -> None:
    async with tcp_pair() as (sock, _peer):
        caught: list[trio.ClosedResourceError] = []

        async def read() -> None:
            try:
                await plain_socket.receive(sock, READ_SIZE)
            except trio.ClosedResourceError as exc:
                caught.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            sock.close()  # as the writer's hang-up closes it under a waiting reader
        assert len(caught) == 1


async def test_write_nowait_says_what_the_socket_took_and_never_waits() -> None:
    async with tcp_pair() as (sock, peer):
        assert plain_socket.write_nowait(sock, b"reply") == 5
        assert await peer.receive_some(READ_SIZE) == b"reply"
        chunk = b"x" * (1 << 20)
        took = [plain_socket.write_nowait(sock, chunk) for _ in range(64)]  # the peer reads none
        assert took[0] > 0
        assert took[-1] == 0  # full: nothing taken, nothing raised, no wait
        sock.close()
        assert plain_socket.write_nowait(sock, b"more") == 0  # closed: nothing either


# -- the connection: its socket read directly over plain TCP, its stream otherwise ----------


@service("echo")
class Echo:
    @handler(inline=True)
    def echo(self, x: Any) -> Any:
        return x

    @handler
    async def later(self, x: Any) -> Any:
        return x


def _stream_reads(client: Client) -> list[int]:
    """Count the reads of the client connection's stream (white box): the plain path has none."""
    amqp = client._conn.amqp if client._conn else None
    assert amqp is not None
    counted = [0]
    receive_some = amqp.stream.receive_some

    async def counting(max_bytes: int | None = None) -> bytes | bytearray:
        counted[0] += 1
        return await receive_some(max_bytes)

    amqp.stream.receive_some = counting  # type: ignore[method-assign]
    return counted


async def _calls(client: Client) -> list[Any]:
    echo = await client.service("echo")
    replies = [await echo.echo(n) for n in range(20)]  # sequential: read, write through
    replies.append(await echo.echo(b"y" * (3 * READ_SIZE)))  # a reply of several reads
    async with trio.open_nursery() as nursery:  # pipelined, some answered by a worker task
        for n in range(20):
            nursery.start_soon(echo.later if n % 2 else echo.echo, n)
    return replies


async def test_plain_tcp_reads_the_socket_directly_and_answers_as_the_stream_path_does(
    tls_files: TlsFiles,
) -> None:
    async with (
        open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as plain,
        open_server(
            Echo, listen="amqps://127.0.0.1:0", ssl_context=tls_files.server_context(), grace=1
        ) as tls,
    ):
        results = {}
        for name, url, context in (
            ("plain", plain.url, None),
            ("tls", tls.url, tls_files.client_context()),
        ):
            async with connect(url, ssl_context=context, timeout=30) as client:
                await (await client.service("echo")).echo(0)  # connected and paired
                reads = _stream_reads(client)
                results[name] = (await _calls(client), reads[0] > 0)
        assert results["plain"][1] is False  # read from the socket, never through the stream
        assert results["tls"][1] is True
        assert results["plain"][0] == results["tls"][0] == [*range(20), b"y" * (3 * READ_SIZE)]
