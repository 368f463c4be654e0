"""A listener that lets anonymous peers in takes the plain AMQP header (no SASL layer) as well as
the SASL one; one that requires users answers it with the SASL header and hangs up (issue 11
§1). Over real TCP, with raw bytes for the peer, so nothing of ours helps the peer along."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from pairlink import open_server
from pairlink._amqp.framing import AMQP_HEADER, SASL_HEADER, FrameReader, encode_frame
from pairlink._amqp.messaging import Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Begin, Open
from pairlink._amqp.sasl import ANONYMOUS_IDENTITY
from pairlink._io.connection import AmqpConnection
from pairlink._io.listener import listen
from pairlink._io.login_throttle import LoginThrottle
from pairlink._io.net import connect
from pairlink.errors import AuthenticationError, ConnectionLostError
from services.echo import Echo
from tests.listening import no_links
from tests.tls import CLIENT_IDENTITY, TlsFiles

USERS = {"alice": "s3cret"}
LOCAL = "amqp://127.0.0.1:0"


def plain_burst() -> bytes:
    """What a client without SASL writes first: header, open, begin, and an attach of a sender
    to the echo service."""
    out = bytearray(AMQP_HEADER)
    encode_frame(out, 0, Open(container_id="raw-peer"))
    encode_frame(out, 0, Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10))
    attach = Attach(
        name="to-echo",
        handle=0,
        role=ROLE_SENDER,
        source=Source(address="raw"),
        target=Target(address="echo"),
        initial_delivery_count=0,
    )
    encode_frame(out, 0, attach)
    return bytes(out)


async def read_until(stream: trio.abc.Stream, kinds: list[type]) -> tuple[bytes, list[Any]]:
    """The protocol header the server answered with and its performatives, read until one of
    each of ``kinds`` has come (or the server hangs up)."""
    reader = FrameReader()
    header: bytes | None = None
    seen: list[Any] = []
    with trio.fail_after(10):
        while not all(any(isinstance(p, k) for p in seen) for k in kinds):
            data = await stream.receive_some(65536)
            if not data:
                break
            reader.feed(data)
            if header is None:
                header = reader.read_protocol_header()
                if header is None:
                    continue
            while (frame := reader.read_frame()) is not None:
                seen.append(frame.performative)
    assert header is not None, "the server said nothing"
    return header, seen


async def read_to_eof(stream: trio.abc.Stream) -> bytes:
    """Everything the server writes until it hangs up (a reset counts as hanging up)."""
    received = b""
    with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


@contextlib.asynccontextmanager
async def raw_peer(port: int) -> AsyncIterator[trio.SocketStream]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        yield stream


async def test_a_raw_peer_without_sasl_gets_the_plain_header_open_begin_and_attach_back() -> None:
    async with open_server(Echo, listen=LOCAL, grace=1) as server, raw_peer(server.port) as peer:
        await peer.send_all(plain_burst())
        header, frames = await read_until(peer, [Open, Begin, Attach])
    assert header == AMQP_HEADER  # no SASL header: the peer asked for none
    opened, begun, attached = frames[:3]
    assert isinstance(opened, Open) and "LINK_PAIR_V1_0" in (opened.offered_capabilities or ())
    assert isinstance(begun, Begin) and begun.remote_channel == 0
    assert isinstance(attached, Attach) and attached.name == "to-echo"
    assert attached.target is not None and attached.target.address == "echo"  # accepted


class Peers:
    """A listener's ``accept`` that keeps each connection's SASL identity."""

    def __init__(self) -> None:
        self.identities: list[str | None] = []

    def accept(self, conn: AmqpConnection) -> Any:
        self.identities.append(conn.sasl_identity)
        return no_links(conn)


@pytest.mark.parametrize(
    "options",
    [{}, {"certificate_users": frozenset()}, {"users": USERS, "allow_anonymous": True}],
    ids=["no-users", "no-certificate-users", "anonymous-too"],
)
async def test_a_peer_without_sasl_is_anonymous(options: dict[str, Any]) -> None:
    peers = Peers()
    async with listen(LOCAL, accept=peers.accept, **options) as listener:
        async with raw_peer(listener.port) as peer:
            await peer.send_all(plain_burst())
            header, _ = await read_until(peer, [Open])
        async with connect(listener.url) as ours:  # SASL ANONYMOUS, as our client says
            await ours.wait_opened()
    assert header == AMQP_HEADER
    assert peers.identities == [ANONYMOUS_IDENTITY, ANONYMOUS_IDENTITY]


async def test_amqps_without_sasl_gets_the_plain_header_and_open_back(tls_files: TlsFiles) -> None:
    async with open_server(
        Echo, listen="amqps://127.0.0.1:0", ssl_context=tls_files.server_context(), grace=1
    ) as server:
        tcp = await trio.open_tcp_stream("127.0.0.1", server.port)
        context = tls_files.client_context()
        async with trio.SSLStream(tcp, context, server_hostname="127.0.0.1") as peer:
            await peer.send_all(plain_burst())
            header, frames = await read_until(peer, [Open, Attach])
    assert header == AMQP_HEADER
    assert isinstance(frames[0], Open)
    assert any(isinstance(f, Attach) and f.target is not None for f in frames)


async def test_a_server_with_users_answers_the_plain_header_with_sasl_and_hangs_up() -> None:
    async with (
        open_server(Echo, listen=LOCAL, users=USERS, grace=1) as server,
        raw_peer(server.port) as peer,
    ):
        await peer.send_all(plain_burst())
        assert await read_to_eof(peer) == SASL_HEADER  # then nothing: no open, no SASL frames
        # our own client logs in as before
        async with connect(f"amqp://alice:s3cret@127.0.0.1:{server.port}") as ours:
            with trio.fail_after(10):
                await ours.wait_opened()


async def test_a_listener_of_certificate_users_only_refuses_the_plain_header_and_anonymous(
    tls_files: TlsFiles,
) -> None:
    """``certificate_users`` without ``users`` requires a user too: no plain header, no SASL
    ANONYMOUS; the certificate's user logs in with EXTERNAL."""
    peers = Peers()
    async with listen(
        "amqps://127.0.0.1:0",
        accept=peers.accept,
        ssl_context=tls_files.server_context(require_client_cert=True),
        certificate_users={CLIENT_IDENTITY},
    ) as listener:
        context = tls_files.client_context(with_client_cert=True)
        tcp = await trio.open_tcp_stream("127.0.0.1", listener.port)
        async with trio.SSLStream(tcp, context, server_hostname="127.0.0.1") as peer:
            await peer.send_all(plain_burst())
            assert await read_to_eof(peer) == SASL_HEADER
        with pytest.raises(ConnectionLostError, match="we need ANONYMOUS"):  # not offered
            async with connect(listener.url, ssl_context=context) as anonymous:
                await anonymous.wait_opened()
        async with connect(listener.url, ssl_context=context, sasl="EXTERNAL") as user:
            await user.wait_opened()
    assert peers.identities == [CLIENT_IDENTITY]


async def test_a_silent_peer_after_the_plain_header_is_dropped_at_the_handshake_timeout(
    io_clock: trio.testing.MockClock,
) -> None:
    timeout = 5.0
    async with (
        listen(LOCAL, accept=no_links, handshake_timeout=timeout) as listener,
        raw_peer(listener.port) as peer,
    ):
        start = trio.current_time()
        await peer.send_all(AMQP_HEADER)
        assert await read_to_eof(peer) == AMQP_HEADER  # accepted, then dropped: no open came
        assert trio.current_time() - start >= timeout
        assert not listener.connections


async def test_the_plain_header_neither_escapes_nor_feeds_the_login_throttle(
    io_clock: trio.testing.MockClock,
) -> None:
    """After a wrong password, a peer without SASL from that address waits its turn like any
    connection; and refused plain headers are no failed logins: they slow no one."""
    penalty = 5.0
    throttle = LoginThrottle(penalty=penalty)
    async with listen(
        LOCAL, accept=no_links, users=USERS, allow_anonymous=True, login_throttle=throttle
    ) as listener:
        with pytest.raises(AuthenticationError):
            async with connect(f"amqp://alice:wrong@127.0.0.1:{listener.port}") as bad:
                await bad.wait_opened()
        start = trio.current_time()
        async with raw_peer(listener.port) as peer:
            await peer.send_all(plain_burst())
            header, _ = await read_until(peer, [Open])
        assert header == AMQP_HEADER
        assert trio.current_time() - start >= penalty  # throttled like a login

    throttle = LoginThrottle(penalty=penalty)
    async with listen(LOCAL, accept=no_links, users=USERS, login_throttle=throttle) as listener:
        for _ in range(3):
            async with raw_peer(listener.port) as peer:
                await peer.send_all(plain_burst())
                assert await read_to_eof(peer) == SASL_HEADER
        start = trio.current_time()
        async with connect(f"amqp://alice:s3cret@127.0.0.1:{listener.port}") as ours:
            await ours.wait_opened()
        assert trio.current_time() - start < penalty  # not slowed by the refusals
