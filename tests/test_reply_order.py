"""An unsettled request is settled before its reply, or in the same write (issue 25):
azure-uamqp discards a reply to a request it holds no disposition for, then fails the call.
Checked on the frames a bare engine caller receives, for each kind of handler."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pairlink import open_server
from pairlink._amqp.messaging import Accepted
from pairlink._amqp.performatives import Disposition, Transfer
from services.echo import Echo
from tests.service_peers import RawClient, raw_client


@pytest.fixture
async def raw() -> AsyncIterator[RawClient]:
    async with (
        open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as server,
        raw_client(server.url) as client,
    ):
        yield client


@pytest.mark.parametrize("operation", ["echo", "echo_thread", "echo_async"])
async def test_the_requests_disposition_comes_before_its_reply(
    raw: RawClient, operation: str
) -> None:
    sender, _ = raw.pair("echo")
    mid, delivery = raw.request(sender, operation, "x", settled=False)
    reply = await raw.wait_reply(mid)
    assert reply.body is not None
    await raw.read_until(lambda: delivery.remote_settled)
    assert isinstance(delivery.remote_state, Accepted)
    kinds = [
        type(f)
        for f in raw.frames
        if isinstance(f, Disposition) or (isinstance(f, Transfer) and f.handle is not None)
    ]
    assert kinds == [Disposition, Transfer]
