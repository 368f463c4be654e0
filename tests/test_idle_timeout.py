"""A silent peer is declared dead within our idle timeout of its last frame, through the whole
Trio layer (issue 9 §4: GO took 59 s to see a hung CO with ``idle_timeout = 30``, because the
last frame's time was only taken at the next timer tick). On a mock clock, so exact."""

from __future__ import annotations

import trio
import trio.testing

from pairlink._amqp import errors
from pairlink._amqp.config import ConnectionConfig
from pairlink._amqp.framing import AMQP_HEADER, HEARTBEAT, encode_frame
from pairlink._amqp.performatives import Open
from pairlink._io.net import open_connection

IDLE = 30.0


async def test_a_silent_peer_is_dead_within_the_idle_timeout_of_its_last_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    peer, ours = trio.testing.memory_stream_pair()
    hello = bytearray(AMQP_HEADER)
    encode_frame(hello, 0, Open(container_id="quiet-peer"))
    config = ConnectionConfig("server", idle_timeout=IDLE)
    async with open_connection(ours, config, initiator=False) as conn:
        await peer.send_all(bytes(hello))
        await conn.wait_opened()
        # frames at uneven times, the last one just after a timer tick would have run
        for wait in (IDLE * 0.6, IDLE * 0.9, 0.001):
            await trio.sleep(wait)
            await peer.send_all(HEARTBEAT)
        last = trio.current_time()
        with trio.fail_after(IDLE * 3):
            await conn.closed.wait()
        assert last + IDLE <= trio.current_time() <= last + IDLE + 1.0
        assert conn.error is not None
        assert conn.error.condition == errors.RESOURCE_LIMIT_EXCEEDED  # §2.4.5's condition
