"""A server engine whose SASL lets anonymous peers in also takes the plain AMQP header (protocol
id 0): no SASL exchange, the peer is anonymous as if it had said ANONYMOUS. One that requires
credentials answers that header with the SASL header and hangs up (§2.2: the header of the
protocol it does support)."""

from __future__ import annotations

import pytest

from pairlink._amqp import errors
from pairlink._amqp.codec import encode
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import (
    ConnectionOpened,
    LinkAttachRequested,
    ProtocolViolation,
    SaslDone,
    TransportFailed,
)
from pairlink._amqp.framing import AMQP_HEADER, FRAME_SASL, SASL_HEADER
from pairlink._amqp.messaging import Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Begin, Open, SaslInit
from pairlink._amqp.sasl import ANONYMOUS_IDENTITY, SaslClient, SaslServer
from pairlink._amqp.testing import engine_pair, pump
from tests.amqp.engine_peer import frame, frames, of, raw

ANONYMOUS_SERVERS = {
    "anonymous-only": SaslServer(),
    "users-and-anonymous": SaslServer.with_users({"alice": "s3cret"}, allow_anonymous=True),
}
REQUIRING_SERVERS = {
    "users": SaslServer.with_users({"alice": "s3cret"}),
    "certificate-only": SaslServer(mechanisms=(), external_identity="client.example"),
}


def server_with(sasl: SaslServer) -> Connection:
    return Connection(ConnectionConfig("server", sasl=sasl), initiator=False)


def burst() -> bytes:
    """What a client without SASL writes at once: header, open, begin, attach."""
    attach = Attach(
        name="l",
        handle=0,
        role=ROLE_SENDER,
        source=Source(address="a"),
        target=Target(address="q"),
        initial_delivery_count=0,
    )
    return b"".join(
        [
            AMQP_HEADER,
            raw(0, Open(container_id="no-sasl")),
            raw(0, Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)),
            raw(0, attach),
        ]
    )


@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("sasl", ANONYMOUS_SERVERS.values(), ids=list(ANONYMOUS_SERVERS))
def test_a_server_admitting_anonymous_peers_takes_the_plain_header(
    sasl: SaslServer, chunk: int | None
) -> None:
    server = server_with(sasl)
    data = burst()
    step = chunk or len(data)
    events = []
    for i in range(0, len(data), step):
        events += server.receive_data(data[i : i + step])
    (done,) = of(events, SaslDone)
    assert (done.mechanism, done.outcome, done.identity) == (None, 0, ANONYMOUS_IDENTITY)
    assert server.sasl_identity == ANONYMOUS_IDENTITY
    assert of(events, ConnectionOpened) and of(events, LinkAttachRequested)
    assert not of(events, ProtocolViolation) and not of(events, TransportFailed)
    out = server.data_to_send()
    assert out.startswith(AMQP_HEADER)  # no SASL header: the peer did not ask for SASL
    assert [type(f) for f in frames(out, headers=1)] == [Open, Begin]


@pytest.mark.parametrize("sasl", REQUIRING_SERVERS.values(), ids=list(REQUIRING_SERVERS))
def test_a_server_requiring_credentials_answers_with_the_sasl_header_and_hangs_up(
    sasl: SaslServer,
) -> None:
    server = server_with(sasl)
    events = server.receive_data(burst())
    assert server.data_to_send() == SASL_HEADER
    (failed,) = of(events, TransportFailed)
    assert "skipped SASL" in failed.reason
    assert server.transport_done and server.closed and server.sasl_identity is None
    assert not of(events, ConnectionOpened) and not of(events, SaslDone)
    assert server.receive_data(burst()) == []  # nothing more is read


def test_a_client_without_sasl_and_an_anonymous_sasl_server_open_both_ways() -> None:
    client, server = engine_pair(
        ConnectionConfig("client"), ConnectionConfig("server", sasl=SaslServer())
    )
    client.open()
    server.open()
    ev_c, ev_s = pump(client, server)
    assert of(ev_c, ConnectionOpened) and of(ev_s, ConnectionOpened)
    assert server.sasl_identity == ANONYMOUS_IDENTITY


@pytest.mark.parametrize("sasl", ANONYMOUS_SERVERS.values(), ids=list(ANONYMOUS_SERVERS))
def test_the_sasl_header_still_gets_sasl(sasl: SaslServer) -> None:
    client, server = engine_pair(
        ConnectionConfig("client", sasl=SaslClient.anonymous()),
        ConnectionConfig("server", sasl=sasl),
    )
    client.open()
    first = client.data_to_send()
    assert first == SASL_HEADER
    server.receive_data(first)
    answer = server.data_to_send()
    assert answer.startswith(SASL_HEADER)  # then sasl-mechanisms, and the exchange goes on
    client.receive_data(answer)
    ev_c, ev_s = pump(client, server)
    assert of(ev_s, SaslDone)[0].mechanism == "ANONYMOUS"
    assert of(ev_c, ConnectionOpened) and server.sasl_identity == ANONYMOUS_IDENTITY


def test_a_sasl_frame_after_the_plain_header_is_a_framing_error() -> None:
    """Skipping SASL is for the whole connection: SASL cannot start once AMQP has."""
    server = server_with(SaslServer())
    sasl_init = frame(0, encode(SaslInit(mechanism="ANONYMOUS")), FRAME_SASL)
    events = server.receive_data(AMQP_HEADER + sasl_init)
    (pv,) = of(events, ProtocolViolation)
    assert pv.condition == errors.FRAMING_ERROR


def test_a_client_with_sasl_refuses_a_server_that_answers_without_it() -> None:
    """Our own client keeps to SASL: a plain header in answer is no SASL layer."""
    client = Connection(ConnectionConfig("c", sasl=SaslClient.anonymous()), initiator=True)
    client.open()
    client.data_to_send()
    events = client.receive_data(AMQP_HEADER)
    assert of(events, TransportFailed) and client.transport_done
    assert client.data_to_send() == b""
