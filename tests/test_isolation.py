"""One connection's trouble stays in that connection (issue 9 §1, §4), over real TCP.

The backstop: an exception while handling one connection's input closes that connection alone
with ``amqp:internal-error``; the listener and the other connections go on. The limits: a
connection that never finishes its handshake is dropped, a listener holds at most
``max_connections`` at once, and the engine's refusals reach a caller as pairlink errors.
"""

from __future__ import annotations

import contextlib
import ssl

import pytest
import trio

from pairlink import MessageTooLargeError, connect, handler, open_server, service
from pairlink._amqp import errors
from pairlink._amqp.framing import AMQP_HEADER
from pairlink._amqp.link import Link
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import accept_receiver, open_sender
from pairlink._io.listener import default_max_connections, listen
from pairlink._io.net import connect as amqp_connect
from pairlink.errors import ConnectionLostError
from tests.listening import answering, no_links
from tests.tls import TlsFiles


class Boom(RuntimeError):
    pass


def accept_or_explode(conn: AmqpConnection, link: Link) -> None:
    """An ``on_attach`` with a bug: it raises for links named ``boom``."""
    if link.name == "boom":
        raise Boom("a bug in the code that answers attaches")
    accept_receiver(conn, link, credit=5)


async def test_an_exception_in_one_connection_closes_it_alone_with_internal_error() -> None:
    async with (
        listen("amqp://127.0.0.1:0", accept=answering(accept_or_explode)) as listener,
        amqp_connect(listener.url) as bystander,
        amqp_connect(listener.url) as victim,
    ):
        await bystander.wait_opened()
        open_sender(victim, "anywhere", name="boom")
        with trio.fail_after(10):
            await victim.closed.wait()
        assert victim.error is not None
        assert victim.error.condition == errors.INTERNAL_ERROR
        assert "ref " in victim.error.description  # the reference the server logged
        # the listener and the other connection go on
        sender = open_sender(bystander, "anywhere", name="fine")
        with trio.fail_after(10):
            await sender.attached.wait()
        assert sender.detached is None
        async with amqp_connect(listener.url) as late:
            late_sender = open_sender(late, "anywhere", name="also-fine")
            with trio.fail_after(10):
                await late_sender.attached.wait()
            assert late_sender.detached is None


async def test_a_silent_tcp_connection_is_dropped_after_the_handshake_timeout() -> None:
    async with listen("amqp://127.0.0.1:0", accept=no_links, handshake_timeout=0.3) as listener:
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        async with stream:
            with trio.fail_after(10):
                assert await stream.receive_some(1024) == b""  # EOF: the server hung up
        assert not listener.connections


async def test_a_peer_that_stops_after_the_protocol_header_is_dropped() -> None:
    async with listen("amqp://127.0.0.1:0", accept=no_links, handshake_timeout=0.3) as listener:
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        async with stream:
            await stream.send_all(AMQP_HEADER)
            received = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(1024):
                    received += chunk
            assert received.startswith(b"AMQP")  # answered with a header, then dropped


async def test_a_tls_peer_that_stays_silent_after_the_tls_handshake_is_dropped(
    tls_files: TlsFiles,
) -> None:
    client_ctx = ssl.create_default_context(cafile=str(tls_files.ca_cert))
    async with listen(
        "amqps://127.0.0.1:0",
        accept=no_links,
        ssl_context=tls_files.server_context(),
        handshake_timeout=0.5,
    ) as listener:
        tcp = await trio.open_tcp_stream("127.0.0.1", listener.port)
        stream = trio.SSLStream(tcp, client_ctx, server_hostname="127.0.0.1")
        async with stream:
            await stream.do_handshake()
            # EOF, or (no TLS close_notify) a broken stream: a hang-up either way
            with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
                assert await stream.receive_some(1024) == b""


async def test_past_max_connections_a_new_connection_is_closed_at_once() -> None:
    async with listen("amqp://127.0.0.1:0", accept=no_links, max_connections=2) as listener:
        async with amqp_connect(listener.url) as first, amqp_connect(listener.url) as second:
            await first.wait_opened()
            await second.wait_opened()
            extra = await trio.open_tcp_stream("127.0.0.1", listener.port)
            async with extra:
                await extra.send_all(AMQP_HEADER)
                with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
                    assert await extra.receive_some(1024) == b""  # (a reset is a hang-up too)
        # both gone: there is room again
        async with amqp_connect(listener.url) as again:
            with trio.fail_after(10):
                await again.wait_opened()


async def test_when_full_of_silent_sockets_a_real_client_evicts_the_oldest() -> None:
    async with listen("amqp://127.0.0.1:0", accept=no_links, max_connections=2) as listener:
        first = await trio.open_tcp_stream("127.0.0.1", listener.port)
        second = await trio.open_tcp_stream("127.0.0.1", listener.port)
        async with first, second:
            await second.send_all(AMQP_HEADER)  # (the server has seen both by now)
            await second.receive_some(8)
            async with amqp_connect(listener.url) as client:
                with trio.fail_after(10):
                    await client.wait_opened()  # admitted: the oldest silent one made room
                with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
                    assert await first.receive_some(1024) == b""  # the evicted one


def test_the_default_connection_limit_leaves_descriptors_for_the_process() -> None:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = default_max_connections()
    assert limit >= 16
    if soft != resource.RLIM_INFINITY:
        assert limit < soft


@service("tiny")
class Tiny:
    @handler
    async def echo(self, x: object) -> object:
        return x


async def test_a_call_over_the_peers_max_message_size_is_a_pairlink_error() -> None:
    async with (
        open_server(Tiny, listen="amqp://127.0.0.1:0", max_message_size=4096) as server,
        connect(server.url) as client,
    ):
        tiny = await client.service("tiny")
        assert await tiny.echo("small") == "small"  # the pair is attached: its limit is known
        with pytest.raises(MessageTooLargeError) as exc:
            await tiny.echo("x" * 10_000)
        assert exc.value.limit == 4096
        assert exc.value.condition == errors.MESSAGE_SIZE_EXCEEDED
        assert "4,096" in str(exc.value)
        assert await tiny.echo("still fine") == "still fine"


async def test_the_client_survives_a_bug_in_its_own_handling_as_a_lost_connection() -> None:
    """The backstop is the transport's, so it guards client connections too: a call on a
    connection whose handling failed ends with ConnectionLostError, not the bug's exception."""

    def explode(conn: AmqpConnection, link: Link) -> None:
        raise Boom("a bug in a client-side hook")

    async with (
        listen("amqp://127.0.0.1:0", accept=answering(accept_or_explode)) as listener,
        amqp_connect(listener.url, on_attach=explode) as conn,
    ):
        await conn.wait_opened()
        (server_conn,) = listener.connections
        open_sender(server_conn, "to-client")  # the server's attach makes the client's hook run
        with trio.fail_after(10):
            await conn.closed.wait()
        assert isinstance(conn.error, ConnectionLostError)
        assert conn.error.condition == errors.INTERNAL_ERROR
        with pytest.raises(ConnectionLostError):
            open_sender(conn, "x")


async def test_past_max_links_a_new_link_is_refused_and_the_others_go_on() -> None:
    async with (
        listen("amqp://127.0.0.1:0", accept=answering(accept_or_explode), max_links=3) as listener,
        amqp_connect(listener.url) as conn,
    ):
        senders = [open_sender(conn, "anywhere", name=f"link-{i}") for i in range(4)]
        with trio.fail_after(10):
            for sender in senders:
                await sender.attached.wait()
        refused = senders[3]
        assert refused.detached is not None
        assert refused.detached.condition == errors.RESOURCE_LIMIT_EXCEEDED
        assert all(sender.detached is None for sender in senders[:3])
        # the bound is per connection: another connection attaches as before
        async with amqp_connect(listener.url) as other:
            again = open_sender(other, "anywhere", name="link-0")
            with trio.fail_after(10):
                await again.attached.wait()
            assert again.detached is None
