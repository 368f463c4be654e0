"""Apache Qpid Proton clients against our service container, over real TCP on 127.0.0.1.

(a) a Proton client that opens the link pair by hand (one link name for both links,
``properties={paired: true}``, ``reply_to="$me"``); (b) Proton's classic request-response
client: a sender to the service and a receiver with a dynamic source, replies to its address.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from proton import Message

from pairlink import open_server
from pairlink._rpc import wire
from pairlink._server.serving import Server
from services.echo import Echo
from tests.interop.proton_peers import run_client
from tests.interop.proton_rpc import ProtonRpcClient

COUNT = 50


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


def request(i: int, operation: str = "echo", reply_to: str | None = wire.ME) -> Message:
    """A request as a Proton user writes it: amqp-value body (a list: the positional
    arguments), the operation in the application properties."""
    return Message(
        id=f"req-{i}",
        reply_to=reply_to,
        body=[f"hello {i}"],
        properties={wire.OPERATION: operation},
    )


def status_of(reply: Message) -> Any:
    props: Any = reply.properties  # Proton's annotations say None here
    return props[wire.STATUS_CODE]


async def test_proton_client_pairing_by_hand_gets_replies_on_the_pair(server: Server) -> None:
    result = await trio.to_thread.run_sync(
        functools.partial(
            run_client,
            server.url,
            send_to="echo",
            receive_from="echo",
            link_name="proton-pair",
            link_properties={"paired": True},
            messages=[request(i) for i in range(COUNT)] + [request(COUNT, "nope")],
            expect=COUNT + 1,
            timeout=10,
        )
    )
    assert result.error is None
    assert "LINK_PAIR_V1_0" in result.remote_offered_capabilities
    assert result.outcomes == ["accepted"] * (COUNT + 1)  # Proton sends unsettled
    by_id = {m.correlation_id: m for m in result.received}
    assert len(by_id) == COUNT + 1
    for i in range(COUNT):
        reply = by_id[f"req-{i}"]
        assert reply.address == wire.ME  # Proton's Message.address is the `to` field
        assert status_of(reply) == 200
        assert reply.body == f"hello {i}"  # answered in the request's encoding: amqp-value
    assert status_of(by_id[f"req-{COUNT}"]) == 404


async def test_proton_classic_client_with_a_dynamic_reply_node(server: Server) -> None:
    client = ProtonRpcClient(server.url, "echo", [request(i, reply_to=None) for i in range(COUNT)])
    result = await trio.to_thread.run_sync(client.run)
    assert result.error is None
    assert result.reply_address is not None
    assert result.reply_address.startswith(f"{server.container_id}/dyn/")
    assert result.outcomes == ["accepted"] * COUNT
    assert sorted(str(m.correlation_id) for m in result.replies) == sorted(
        f"req-{i}" for i in range(COUNT)
    )
    for reply in result.replies:
        assert reply.address == result.reply_address
        assert status_of(reply) == 200
        assert reply.body == f"hello {str(reply.correlation_id)[4:]}"
