"""Every open of ours names the product and its version (issue 25): the client's, both
gateways' (as listeners and as upstream callers) and the service container's, as the byte taps
between the hops of the chain saw them. azure-eventhub 5.15 reads open's properties field
without checking that it is there."""

from __future__ import annotations

from pairlink import connect
from pairlink._amqp.performatives import Open
from pairlink._amqp.types import Symbol
from pairlink._version import VERSION
from tests.gateway.chain import CLIENT_ID, PUBLIC, open_chain


async def test_every_open_names_pairlink_and_its_version() -> None:
    async with open_chain() as chain:
        async with connect(chain.url, container_id=CLIENT_ID) as client:
            assert await client.call(PUBLIC, "echo", "hi") == "hi"
        opens: list[Open] = []
        for tap in chain.taps:  # client, GN upstream, GO upstream; GN, GO, the container
            for side in (tap.up(), tap.down()):
                found = side.of(Open)
                assert found, tap  # (a gateway may open more than one connection upstream)
                opens += found
    senders = {str(o.container_id) for o in opens}
    assert {CLIENT_ID, "gn", "go"} <= senders and len(senders) == 4  # and the container
    for opened in opens:
        assert opened.properties is not None
        assert opened.properties[Symbol("product")] == "pairlink"
        assert opened.properties[Symbol("version")] == VERSION
