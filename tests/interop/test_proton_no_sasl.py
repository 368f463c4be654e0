"""Apache Qpid Proton clients that open without SASL (``sasl_enabled=False``: the plain AMQP
header, as rhea's default client and Proton C's examples do) call a pairlink service over real
TCP, and over TLS; a server with users refuses them. And a Proton client whose terminus
capabilities go out as an AMQP list (Proton's ``Data.put_object`` of a Python list), where the
spec has a multiple symbol field, is served as if it had sent an array (issue 11 §1)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from proton import Message, symbol
from proton.reactor import Container
from proton.utils import BlockingConnection

from pairlink import open_server
from pairlink._rpc import wire
from pairlink._server.serving import Server
from services.echo import Echo
from tests.interop.proton_common import client_ssl_domain
from tests.interop.proton_peers import ProtonClient
from tests.tls import TlsFiles

COUNT = 20


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Echo, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


def request(i: int, reply_to: str | None = wire.ME) -> Message:
    """A request as a Proton user writes it: one argument as the amqp-value body."""
    return Message(
        id=f"req-{i}", reply_to=reply_to, body=f"hello {i}", properties={wire.OPERATION: "echo"}
    )


def without_sasl(client: ProtonClient) -> ProtonClient:
    """``client`` with its SASL layer off: it opens with the plain AMQP header."""
    client.connect_kwargs["sasl_enabled"] = False
    return client


def pairing_client(url: str, **kwargs: Any) -> ProtonClient:
    """A Proton client pairing by hand with the echo service (one link name for both links,
    ``paired: true``, ``reply_to = "$me"``), COUNT requests."""
    return ProtonClient(
        url,
        send_to="echo",
        receive_from="echo",
        link_name="proton-no-sasl",
        link_properties={"paired": True},
        messages=[request(i) for i in range(COUNT)],
        expect=COUNT,
        timeout=10,
        **kwargs,
    )


def check_replies(client: ProtonClient) -> None:
    result = client.start().wait()
    assert result.error is None
    assert "LINK_PAIR_V1_0" in result.remote_offered_capabilities
    assert result.outcomes == ["accepted"] * COUNT
    replies = {str(m.correlation_id): m for m in result.received}
    assert sorted(replies) == sorted(f"req-{i}" for i in range(COUNT))
    for i in range(COUNT):
        reply: Any = replies[f"req-{i}"]
        assert reply.properties[wire.STATUS_CODE] == 200
        assert reply.body == f"hello {i}"


async def test_a_proton_client_without_sasl_calls_a_service(server: Server) -> None:
    client = without_sasl(pairing_client(server.url))
    await trio.to_thread.run_sync(check_replies, client)


async def test_a_proton_client_without_sasl_over_tls_calls_a_service(tls_files: TlsFiles) -> None:
    async with open_server(
        Echo, listen="amqps://127.0.0.1:0", ssl_context=tls_files.server_context(), grace=1
    ) as server:
        client = without_sasl(pairing_client(server.url, tls=tls_files))
        await trio.to_thread.run_sync(check_replies, client)


async def test_a_server_with_users_refuses_a_proton_client_without_sasl() -> None:
    async with open_server(
        Echo, listen="amqp://127.0.0.1:0", users={"alice": "s3cret"}, grace=1
    ) as server:
        client = without_sasl(pairing_client(server.url))
        result = await trio.to_thread.run_sync(client.start().wait)
    # the SASL header in answer to its plain one, then the hang-up
    assert result.error is not None and "got: AMQP SASL layer" in result.error
    assert result.received == [] and result.outcomes == [None] * COUNT


def blocking_call(url: str, tls: TlsFiles | None = None) -> Any:
    """Proton's BlockingConnection without SASL: the classic client with a dynamic reply node
    (receive only: what its ``accept`` makes of the reply's settlement is another story)."""
    conn = BlockingConnection(
        url,
        timeout=10,
        container=Container(),
        ssl_domain=client_ssl_domain(tls) if tls is not None else None,
        sasl_enabled=False,
    )
    try:
        receiver = conn.create_receiver(None, dynamic=True)
        sender = conn.create_sender("echo")
        reply_to = receiver.link.remote_source.address
        sender.send(request(0, reply_to=reply_to))
        return receiver.receive(timeout=10)
    finally:
        conn.close()


async def test_a_proton_blocking_connection_without_sasl_calls_a_service(server: Server) -> None:
    reply = await trio.to_thread.run_sync(blocking_call, server.url)
    assert str(reply.correlation_id) == "req-0" and reply.body == "hello 0"


class CapabilityListClient(ProtonClient):
    """Sets its links' terminus capabilities as Proton's ``Data`` API takes them from Python:
    the target's a list (written as an AMQP list, see test_multiple_fields), the source's a
    single symbol."""

    def on_start(self, event: Any) -> None:
        super().on_start(event)
        assert self._conn is not None
        link = self._conn.link_head(0)
        while link is not None:
            link.target.capabilities.put_object([symbol("queue"), symbol("shared")])
            link.source.capabilities.put_object(symbol("one"))
            link = link.next(0)


@pytest.mark.parametrize("sasl", [True, False], ids=["sasl", "no-sasl"])
async def test_a_proton_client_sending_capabilities_as_a_list_calls_a_service(
    server: Server, sasl: bool
) -> None:
    client = CapabilityListClient(
        server.url,
        send_to="echo",
        receive_from="echo",
        link_name="proton-caps",
        link_properties={"paired": True},
        messages=[request(i) for i in range(COUNT)],
        expect=COUNT,
        timeout=10,
    )
    if not sasl:
        without_sasl(client)
    await trio.to_thread.run_sync(functools.partial(check_replies, client))
