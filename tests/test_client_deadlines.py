"""A deadline is a deadline (issue 22): ``connect(timeout=...)`` bounds connecting too, and
leaving ``connect()`` waits ``CLOSE_WAIT`` at most for a peer that never answers our close.

Against real sockets on 127.0.0.1: a listener that accepts and never says a byte, and a raw
AMQP peer that opens but never answers a close. Time is the ``io_clock``'s (it jumps only while
every socket is idle), so the 30 s that connecting used to take costs no real time either.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from pairlink import connect
from pairlink._amqp.performatives import Close
from pairlink._client.client import CLOSE_WAIT, CONNECT_TIMEOUT
from pairlink._io import net
from pairlink._io.links import open_sender
from pairlink.errors import ConnectionLostError
from tests.client_peers import raw_server
from tests.service_peers import wait_for


@asynccontextmanager
async def mute_listener() -> AsyncIterator[str]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never sends a byte."""
    held: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        handler = functools.partial(_hold, held=held)
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        yield f"amqp://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


async def _hold(stream: trio.SocketStream, *, held: list[trio.SocketStream]) -> None:
    held.append(stream)
    await trio.sleep_forever()


@pytest.mark.parametrize(
    ("options", "bound"),
    [
        ({"timeout": 2.0}, 2.0),  # the calls' timeout bounds connecting
        ({"timeout": 60.0, "connect_timeout": 0.5}, 0.5),  # unless told otherwise
        ({"timeout": None}, CONNECT_TIMEOUT),  # no timeout at all: the documented default
    ],
)
async def test_connecting_to_a_peer_that_never_speaks_gives_up_at_its_deadline(
    options: dict[str, float | None], bound: float, io_clock: trio.testing.MockClock
) -> None:
    async with mute_listener() as url:
        started = trio.current_time()
        with pytest.raises(TimeoutError, match=rf"not connected within {bound:g} s"):
            async with connect(url, **options):  # type: ignore[arg-type]
                pass  # pragma: no cover
        assert bound <= trio.current_time() - started < bound + 0.5


async def test_leaving_connect_waits_close_wait_at_most_for_a_peer_that_never_answers(
    io_clock: trio.testing.MockClock,
) -> None:
    async with raw_server(deaf_to_close=True) as server:
        async with connect(server.url, timeout=60.0, sasl=False):
            started = trio.current_time()  # open: the block runs once the peer's open came
        waited = trio.current_time() - started
        (peer,) = server.peers
        assert peer.performatives(Close)  # our close went out, and was never answered
        assert CLOSE_WAIT <= waited < CLOSE_WAIT + 0.5


async def test_a_link_attached_while_our_close_waits_is_a_lost_connection(
    io_clock: trio.testing.MockClock,
) -> None:
    """Between our close and the connection's end nothing new may start on it: an attach
    then is a ``ConnectionLostError`` the client handles, not the engine's illegal-state
    error (a replica's health check crashed its client so, in a rolling restart)."""
    async with (
        raw_server(deaf_to_close=True) as server,
        trio.open_nursery() as nursery,
        net.connect(server.url, sasl=False) as conn,
    ):
        await conn.wait_opened()
        nursery.start_soon(functools.partial(conn.close, grace=CLOSE_WAIT))
        (peer,) = server.peers
        await wait_for(lambda: bool(peer.performatives(Close)))
        with pytest.raises(ConnectionLostError, match="closing"):
            open_sender(conn, "anywhere")
