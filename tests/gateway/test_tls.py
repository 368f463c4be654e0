"""Gateways between organisations over real TLS (trustme): the config's [tls] and ``ca``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from pairlink import connect, hosted, open_server
from pairlink.errors import ConnectionLostError, LinkDetachedError
from pairlink.gateway import GatewayConfig, Route, open_gateway
from services.echo import Echo
from tests.tls import CLIENT_IDENTITY, TlsFiles, make_tls_files

INTERNAL = "billing.internal"


def _go(tls: TlsFiles, co_url: str) -> GatewayConfig:
    return GatewayConfig(
        listen="amqps://127.0.0.1:0",
        container_id="go",
        tls_cert=str(tls.server_cert),
        tls_key=str(tls.server_key),
        users={"org-n": "n-secret"},
        routes=(Route("billing", co_url, INTERNAL),),
    )


def _gn(tls: TlsFiles, go_port: int, ca: Path) -> GatewayConfig:
    return GatewayConfig(
        listen="amqps://127.0.0.1:0",
        container_id="gn",
        tls_cert=str(tls.server_cert),
        tls_key=str(tls.server_key),
        users={"apps": "apps-secret"},
        attach_timeout=5.0,
        routes=(
            Route(
                "billing",
                f"amqps://localhost:{go_port}",
                "billing",
                user="org-n",
                password="n-secret",
                allow=frozenset({"apps"}),
                ca=str(ca),
            ),
        ),
    )


async def test_lp11_the_chain_over_tls_between_organisations(tls_files: TlsFiles) -> None:
    async with (
        open_server(hosted(Echo, address=INTERNAL), listen="amqp://127.0.0.1:0") as co,
        open_gateway(_go(tls_files, co.url)) as go,
        open_gateway(_gn(tls_files, go.port, tls_files.ca_cert)) as gn,
        connect(
            f"amqps://apps:apps-secret@localhost:{gn.port}",
            ssl_context=tls_files.client_context(),
            timeout=10,
        ) as client,
    ):
        billing = await client.service("billing")
        assert await billing.echo("over tls") == "over tls"
        assert [await billing.echo(i) for i in range(20)] == list(range(20))


async def test_lp11_an_upstream_certificate_the_route_does_not_trust_fails_the_pair(
    tls_files: TlsFiles, tmp_path: Path
) -> None:
    """GN verifies GO against the route's ``ca``: another CA's certificate is no next hop,
    and the caller learns it at once (detach-forced), not by a hang."""
    stranger = make_tls_files(tmp_path / "other-ca")
    async with (
        open_server(hosted(Echo, address=INTERNAL), listen="amqp://127.0.0.1:0") as co,
        open_gateway(_go(tls_files, co.url)) as go,
        open_gateway(_gn(tls_files, go.port, stranger.ca_cert)) as gn,
        connect(
            f"amqps://apps:apps-secret@localhost:{gn.port}",
            ssl_context=tls_files.client_context(),
            timeout=10,
        ) as client,
    ):
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as exc:
            await client.call("billing", "echo", 1)
        assert exc.value.condition == "amqp:link:detach-forced"


def _mutual(tls: TlsFiles, co_url: str, allow: str) -> GatewayConfig:
    """A gateway that demands client certificates, and knows the test client's as a user."""
    return GatewayConfig(
        listen="amqps://127.0.0.1:0",
        container_id="mtls",
        tls_cert=str(tls.server_cert),
        tls_key=str(tls.server_key),
        tls_client_ca=str(tls.ca_cert),
        users={"apps": "apps-secret"},
        certificate_users=frozenset({CLIENT_IDENTITY}),
        routes=(Route("billing", co_url, INTERNAL, allow=frozenset({allow})),),
    )


async def test_mutual_tls_logs_a_certificate_in_as_the_user_allow_lists_name(
    tls_files: TlsFiles,
) -> None:
    async with (
        open_server(hosted(Echo, address=INTERNAL), listen="amqp://127.0.0.1:0") as co,
        open_gateway(_mutual(tls_files, co.url, allow=CLIENT_IDENTITY)) as gw,
        connect(
            f"amqps://localhost:{gw.port}",
            ssl_context=tls_files.client_context(with_client_cert=True),
            sasl="EXTERNAL",
            timeout=10,
        ) as client,
    ):
        assert await client.call("billing", "echo", "by certificate") == "by certificate"
        assert gw.listener is not None
        (downstream,) = gw.listener.handlers.values()
        assert downstream.user == CLIENT_IDENTITY


async def test_mutual_tls_refuses_a_peer_without_a_certificate(tls_files: TlsFiles) -> None:
    async with (
        open_server(hosted(Echo, address=INTERNAL), listen="amqp://127.0.0.1:0") as co,
        open_gateway(_mutual(tls_files, co.url, allow=CLIENT_IDENTITY)) as gw,
    ):
        with trio.fail_after(10), pytest.raises(ConnectionLostError):
            async with connect(
                f"amqps://apps:apps-secret@localhost:{gw.port}",
                ssl_context=tls_files.client_context(),  # a password, but no certificate
                timeout=10,
            ) as client:
                await client.call("billing", "echo", 1)


async def test_mutual_tls_a_certificate_user_the_route_does_not_allow_is_refused(
    tls_files: TlsFiles,
) -> None:
    async with (
        open_server(hosted(Echo, address=INTERNAL), listen="amqp://127.0.0.1:0") as co,
        open_gateway(_mutual(tls_files, co.url, allow="apps")) as gw,
        connect(
            f"amqps://localhost:{gw.port}",
            ssl_context=tls_files.client_context(with_client_cert=True),
            sasl="EXTERNAL",
            timeout=10,
        ) as client,
    ):
        with trio.fail_after(10), pytest.raises(LinkDetachedError) as exc:
            await client.call("billing", "echo", 1)
        assert exc.value.condition == "amqp:unauthorized-access"
