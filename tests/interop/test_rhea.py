"""rhea 3.0.5 (Node.js AMQP 1.0, from npm) against pairlink, over real TCP on 127.0.0.1.

A second peer beside Qpid Proton, written by other people against the same specifications:
(1) a rhea client pairing by hand with a pairlink service (LINK_PAIR_V1_0), (2) rhea's classic
request-response client with a dynamic reply node, (3) pairlink's client against a service
written with rhea, (4) a rhea client through the gateway chain, (5) rhea's default client,
which opens without SASL. The rhea side is ``tests/interop/rhea/*.js`` (run by
:mod:`tests.interop.rhea_peers`); the rhea defects it works around are named there:
``client.js`` puts the two halves of a pair on two sessions (rhea keeps a session's links by
name only) and sends its first request only once both attaches are answered (rhea may write a
transfer before a pending attach, and splits a message by a max-frame-size it has not yet
received); ``server.js`` offers no pairing for the first reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from pairlink import connect, open_server
from pairlink._rpc import wire
from pairlink._rpc.linkpair import LINK_PAIR_V1_0
from pairlink._server.serving import Server
from pairlink.errors import RemoteError
from services.echo import Echo
from tests.gateway.chain import (
    APPS_PASSWORD,
    APPS_USER,
    INTERNAL,
    PUBLIC,
    ByteTap,
    open_chain,
)
from tests.interop.rhea_peers import (
    RHEA_VERSION,
    ClientResult,
    request,
    rhea_server,
    run_client,
)

COUNT = 100
BIG = 1 << 20
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


def echo_requests(count: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``count`` echo requests in the three body shapes a rhea user may write (a list of the
    positional arguments, one bare argument, a map of keywords), and the value each echoes."""
    values = [f"hello {i}" for i in range(count)]
    bodies = [([v], v, {"x": v})[i % 3] for i, v in enumerate(values)]
    return [request(f"req-{i}", "echo", body) for i, body in enumerate(bodies)], values


def assert_echoed(result: ClientResult, values: list[str], *, to: str | None) -> None:
    assert result.error is None
    assert result.rhea == RHEA_VERSION
    assert result.outcomes == ["accepted"] * len(values)  # rhea sends unsettled
    replies = result.by_correlation_id()
    assert len(replies) == len(result.replies) == len(values)
    for i, value in enumerate(values):
        reply = replies[f"req-{i}"]
        assert reply.to == to
        assert reply.status == wire.OK
        assert reply.body == value  # answered in the request's encoding: amqp-value


# -- (1) a rhea client pairing by hand ----------------------------------------------------------


async def test_rhea_client_pairs_by_hand_100_pipelined_calls(server: Server) -> None:
    requests, values = echo_requests(COUNT)
    result = await run_client(server.port, "echo", requests, pattern="paired")
    assert LINK_PAIR_V1_0 in (result.offered_capabilities or [])
    assert_echoed(result, values, to=wire.ME)


async def test_rhea_client_pairs_by_hand_1_mib_body(server: Server) -> None:
    # rhea 3.0.5 splits a message into frames by the peer's max-frame-size as it was known at
    # send() time: client.js sends only once the attaches (so the open) are answered.
    value = "x" * BIG
    result = await run_client(server.port, "echo", [request("req-0", "echo", [value])])
    assert_echoed(result, [value], to=wire.ME)


async def test_rhea_client_pairs_by_hand_unknown_operation_is_404(server: Server) -> None:
    result = await run_client(server.port, "echo", [request("req-0", "nope", [1])])
    assert result.error is None
    assert result.outcomes == ["accepted"]
    (reply,) = result.replies
    assert reply.correlation_id == "req-0"
    assert reply.status == wire.NOT_FOUND
    assert "nope" in (reply.application_properties or {})[wire.STATUS_DESCRIPTION]


# -- (2) rhea's classic dynamic-reply client ----------------------------------------------------


async def test_rhea_classic_client_with_a_dynamic_reply_node(server: Server) -> None:
    requests, values = echo_requests(COUNT)
    result = await run_client(server.port, "echo", requests, pattern="dynamic")
    assert result.reply_address is not None
    assert result.reply_address.startswith(f"{server.container_id}/dyn/")
    assert_echoed(result, values, to=result.reply_address)


# -- (3) pairlink's client against a rhea service -------------------------------------------------


async def test_our_client_calls_a_rhea_service_and_gets_plain_values() -> None:
    async with rhea_server() as rhea, connect(rhea.url) as client:
        calc = await client.service("calc")
        total = await calc.add(1, 2)  # rhea encodes the 3 as an AMQP uint
        assert total == 3 and type(total) is int
        assert await calc.echo("hi") == "hi"
        assert await calc.ping() == "pong"
        assert await calc.greet(name="rhea") == "hello, rhea"
        with pytest.raises(RemoteError) as raised:
            await calc.call("nope")
        assert raised.value.status == wire.NOT_FOUND and type(raised.value.status) is int
        assert raised.value.message == "unknown operation: nope"
    assert rhea.error is None
    # What a service that is not pairlink receives: amqp-value, one argument bare, none as
    # null, keywords as a map; replies asked on a dynamic node (rhea offers no pairing).
    seen = {(r.application_properties or {}).get(wire.OPERATION): r for r in rhea.requests}
    assert {op: (r.body_kind, r.body) for op, r in seen.items()} == {
        "add": ("amqp-value", [1, 2]),
        "echo": ("amqp-value", "hi"),
        "ping": ("amqp-value", None),
        "greet": ("amqp-value", {"name": "rhea"}),
        "nope": ("amqp-value", None),
    }
    reply_to = {r.reply_to for r in rhea.requests}
    assert len(reply_to) == 1 and str(reply_to.pop()).startswith("rhea-server/dyn/")


# -- (4) a rhea client through the gateway chain ------------------------------------------------


async def test_lp11_rhea_client_pairs_by_hand_through_the_chain() -> None:
    count = 20
    requests, values = echo_requests(count)
    async with open_chain() as chain:
        result = await run_client(
            chain.client_gn.port,
            PUBLIC,
            requests,
            sasl="plain",
            user=(APPS_USER, APPS_PASSWORD),
            container_id="rhea-secret-id",
            link_name="rhea-secret-pair",
        )
        assert_echoed(result, values, to=wire.ME)
        # LP-11: the client's names stay in org N, the internal address in org O
        for tap in (chain.gn_go, chain.go_co):
            assert b"rhea-secret-id" not in tap.all_bytes()
            assert b"rhea-secret-pair" not in tap.all_bytes()
        assert INTERNAL.encode() not in chain.client_gn.all_bytes()
        assert INTERNAL.encode() not in chain.gn_go.all_bytes()
        assert len(chain.go_co.up().messages) == count  # every request went through, once


# -- (5) rhea's default client: no SASL -----------------------------------------------------


async def test_rhea_default_client_without_sasl_calls_an_open_listener(server: Server) -> None:
    async with trio.open_nursery() as nursery:
        tap: ByteTap = await nursery.start(ByteTap("rhea-plain", server.port).run)
        requests, values = echo_requests(3)
        result = await run_client(tap.port, "echo", requests, sasl="none")
        nursery.cancel_scope.cancel()
    assert tap.up_bytes().startswith(AMQP_HEADER)  # rhea opened without a SASL layer
    assert_echoed(result, values, to=wire.ME)
    assert tap.down_bytes().startswith(AMQP_HEADER)  # and was answered in kind


async def test_rhea_default_client_without_sasl_is_refused_where_users_are_required() -> None:
    users = {"someone": "secret-1"}
    async with (
        open_server(Echo, listen="amqp://127.0.0.1:0", users=users, grace=1) as server,
        trio.open_nursery() as nursery,
    ):
        tap: ByteTap = await nursery.start(ByteTap("rhea-refused", server.port).run)
        result = await run_client(tap.port, "echo", echo_requests(1)[0], sasl="none")
        nursery.cancel_scope.cancel()
    assert result.error is not None
    assert result.replies == []
    assert tap.up_bytes().startswith(AMQP_HEADER)
    assert tap.down_bytes() == SASL_HEADER  # the header it speaks, then the connection closes
