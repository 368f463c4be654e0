"""The Trio transport over real TCP on 127.0.0.1: our client against our listener."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from pairlink._amqp import errors
from pairlink._amqp.connection import ConnectionConfig
from pairlink._amqp.framing import AMQP_HEADER, FrameReader, encode_frame
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Accepted, Error, Message, Rejected
from pairlink._amqp.performatives import Attach, Begin, Open
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import Receiver, accept_receiver, open_sender
from pairlink._io.listener import Listener, listen
from pairlink._io.net import connect, open_connection
from pairlink.errors import AuthenticationError, ConnectionLostError, LinkDetachedError
from tests.listening import EachLink, answering
from tests.tls import CLIENT_IDENTITY, TlsFiles


class QueueNode:
    """A tiny broker: senders' messages go into per-address queues, receivers drain them."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery  # where the consumers run
        self.got: dict[str, list[Message]] = {}
        self.reject_address = "reject-me"
        self.users: list[str | None] = []  # each connection's SASL identity, as accepted

    def accept(self, conn: AmqpConnection) -> EachLink:
        self.users.append(conn.sasl_identity)
        return EachLink(conn, self.on_attach)

    def on_attach(self, conn: AmqpConnection, link: Link) -> None:
        if link.is_receiver:  # the peer sends to us
            address = link.remote_target.address if link.remote_target else None
            if address == "missing":
                conn.refuse(link, Error(condition=errors.NOT_FOUND, description="no such node"))
                return
            receiver = accept_receiver(conn, link, credit=50)
            self.nursery.start_soon(self._drain, receiver, str(address))
        else:
            conn.refuse(link, Error(condition=errors.NOT_IMPLEMENTED))

    async def _drain(self, receiver: Receiver, address: str) -> None:
        async for item in receiver:
            self.got.setdefault(address, []).append(item.message)
            if address == self.reject_address:
                receiver.settle(item, Rejected(error=Error(condition=errors.NOT_ALLOWED)))
            else:
                receiver.settle(item, Accepted())


@asynccontextmanager
async def queue_server(**kwargs: Any) -> AsyncIterator[tuple[Listener[EachLink], QueueNode]]:
    async with trio.open_nursery() as nursery:
        node = QueueNode(nursery)
        async with listen("amqp://127.0.0.1:0", accept=node.accept, **kwargs) as listener:
            yield listener, node
        nursery.cancel_scope.cancel()


async def test_thousand_messages_including_one_mib_all_accepted() -> None:
    async with queue_server() as (listener, node), connect(listener.url) as conn:
        sender = open_sender(conn, "q")
        async with trio.open_nursery() as nursery:
            outcomes: list[Any] = []

            async def send(i: int) -> None:
                body = b"x" * (1 << 20) if i == 500 else f"m{i}".encode()
                delivery = await sender.send(Message(body=body, body_kind="data"))
                outcomes.append(delivery.remote_state)

            for i in range(1000):
                nursery.start_soon(send, i)
        assert len(outcomes) == 1000 and all(isinstance(o, Accepted) for o in outcomes)
        got = node.got["q"]
        assert len(got) == 1000
        assert sum(1 for m in got if len(m.body) == 1 << 20) == 1


async def test_rejected_outcome_reaches_the_sender() -> None:
    async with queue_server() as (listener, _), connect(listener.url) as conn:
        delivery = await open_sender(conn, "reject-me").send(Message(body="no"))
        assert isinstance(delivery.remote_state, Rejected)
        assert delivery.remote_state.error is not None
        assert delivery.remote_state.error.condition == errors.NOT_ALLOWED


async def test_an_undecodable_message_is_rejected_and_the_link_lives_on() -> None:
    async with queue_server() as (listener, node), connect(listener.url) as conn:
        sender = open_sender(conn, "q")
        bad = await sender.send(b"\xff\x00 not an AMQP message")
        assert isinstance(bad.remote_state, Rejected)
        assert bad.remote_state.error is not None
        assert bad.remote_state.error.condition == errors.DECODE_ERROR
        good = await sender.send(Message(body="fine"))
        assert isinstance(good.remote_state, Accepted)
        assert [m.body for m in node.got["q"]] == ["fine"]


async def test_refused_link_raises_link_detached_with_the_condition() -> None:
    async with queue_server() as (listener, _), connect(listener.url) as conn:
        sender = open_sender(conn, "missing")
        with pytest.raises(LinkDetachedError) as exc:
            await sender.send(Message(body="x"))
        assert exc.value.condition == errors.NOT_FOUND


async def test_sasl_plain_accepted_and_wrong_password_refused() -> None:
    users = {"alice": "pw"}
    async with queue_server(users=users) as (listener, node):
        async with connect(f"amqp://alice:pw@127.0.0.1:{listener.port}") as conn:
            await conn.wait_opened()
            await open_sender(conn, "q").send(Message(body="hi"))
        assert node.got["q"][0].body == "hi"
        with pytest.raises(AuthenticationError):
            async with connect(f"amqp://alice:nope@127.0.0.1:{listener.port}") as conn:
                await conn.wait_opened()


async def test_tls_both_ways(tls_files: TlsFiles) -> None:
    async with queue_server(ssl_context=tls_files.server_context()) as (listener, node):
        url = f"amqps://127.0.0.1:{listener.port}"
        async with connect(url, ssl_context=tls_files.client_context()) as conn:
            await open_sender(conn, "q").send(Message(body="secret"))
        assert node.got["q"][0].body == "secret"


async def test_an_untrusted_server_certificate_fails_the_handshake_with_its_reason(
    tls_files: TlsFiles,
) -> None:
    async with queue_server(ssl_context=tls_files.server_context()) as (listener, _):
        with pytest.raises(ConnectionLostError) as exc:  # the default context: system CAs
            async with connect(f"amqps://localhost:{listener.port}"):
                pass
    assert "TLS handshake" in str(exc.value) and "CERTIFICATE_VERIFY_FAILED" in str(exc.value)


async def test_sasl_external_takes_the_tls_client_certificate(tls_files: TlsFiles) -> None:
    server_ctx = tls_files.server_context(require_client_cert=True)
    async with queue_server(ssl_context=server_ctx, users={}) as (listener, node):
        url = f"amqps://127.0.0.1:{listener.port}"
        client_ctx = tls_files.client_context(with_client_cert=True)
        async with connect(url, ssl_context=client_ctx, sasl="EXTERNAL") as conn:
            await conn.wait_opened()
    assert node.users == [CLIENT_IDENTITY]


async def silent_peer(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A raw TCP peer that says the AMQP header and open, then nothing at all."""

    async def handler(stream: trio.SocketStream) -> None:
        await stream.receive_some(8)
        out = bytearray(AMQP_HEADER)
        encode_frame(out, 0, Open(container_id="silent"))
        await stream.send_all(bytes(out))
        await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


async def test_idle_timeout_detects_a_silent_peer() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(silent_peer)
        start = trio.current_time()
        with pytest.raises(ConnectionLostError):
            async with connect(f"amqp://127.0.0.1:{port}", idle_timeout=0.5, sasl=False) as conn:
                await conn.wait_opened()
                await conn.closed.wait()
                conn.raise_if_closed()
        assert trio.current_time() - start < 5
        nursery.cancel_scope.cancel()


async def test_peer_close_with_error_fails_waiting_senders() -> None:
    async with queue_server() as (listener, _), connect(listener.url) as conn:
        await conn.wait_opened()
        (server_conn,) = listener.connections
        await server_conn.close(Error(condition=errors.CONNECTION_FORCED, description="bye"))
        await conn.closed.wait()
        with pytest.raises(ConnectionLostError) as exc:
            await open_sender(conn, "q").send(Message(body="late"))
        assert exc.value.condition == errors.CONNECTION_FORCED


async def test_cancellation_leaves_no_socket_open() -> None:
    """Cancelling a connection's block mid-use closes the socket (the peer sees EOF)."""
    got_eof = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        while await stream.receive_some(1024):
            pass
        got_eof.set()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with trio.move_on_after(0.3):
            async with connect(f"amqp://127.0.0.1:{port}") as conn:
                await conn.closed.wait()  # never: the peer says nothing
        with trio.fail_after(5):
            await got_eof.wait()
        nursery.cancel_scope.cancel()


class CountingStream(trio.abc.Stream):
    """A stream that counts its ``send_all`` calls (to see batching)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sends = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_writes_are_batched_into_one_send() -> None:
    """Twenty attaches queued in one go leave in one send_all, over any trio Stream."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    counting = CountingStream(client_stream)
    async with open_connection(counting, ConnectionConfig("c"), initiator=True) as conn:
        await trio.testing.wait_all_tasks_blocked()
        assert counting.sends == 1  # protocol header and open
        for i in range(20):
            open_sender(conn, f"a{i}")
        await trio.testing.wait_all_tasks_blocked()
        assert counting.sends == 2  # begin and twenty attaches
        reader = FrameReader()
        reader.feed(await server_stream.receive_some(1 << 20))
        assert reader.read_protocol_header() == AMQP_HEADER
        kinds = []
        while (frame := reader.read_frame()) is not None:
            kinds.append(type(frame.performative))
        assert kinds == [Open, Begin] + [Attach] * 20
        await server_stream.aclose()  # the peer goes away: leaving the block is quick


async def test_held_input_answers_a_pipelined_attach_after_a_round_trip_elsewhere() -> None:
    """``hold_input`` (a gateway pairing upstream first): the attach is answered, with credit,
    only after a delay, and the transfer pipelined right behind it is read only then, so it
    finds its credit (LP-10) instead of breaking the link's transfer limit."""
    got: list[Message] = []
    answered_at: list[float] = []

    async with trio.open_nursery() as nursery:

        async def answer_later(conn: AmqpConnection, link: Link, release: Any) -> None:
            await trio.sleep(0.2)  # the round trip elsewhere
            answered_at.append(trio.current_time())
            receiver = accept_receiver(conn, link, credit=5)
            release()
            async for item in receiver:
                got.append(item.message)
                receiver.settle(item, Accepted())

        def on_attach(conn: AmqpConnection, link: Link) -> None:
            nursery.start_soon(answer_later, conn, link, conn.hold_input())

        async with (
            listen("amqp://127.0.0.1:0", accept=answering(on_attach)) as listener,
            connect(listener.url) as conn,
        ):
            sender = open_sender(conn, "q")
            started = trio.current_time()
            first = await sender.send(Message(body="pipelined"), presume_credit=True)
            second = await sender.send(Message(body="then"))
            assert isinstance(first.remote_state, Accepted)
            assert isinstance(second.remote_state, Accepted)
            assert sender.detached is None
        nursery.cancel_scope.cancel()
    assert [m.body for m in got] == ["pipelined", "then"]
    assert answered_at and answered_at[0] - started >= 0.2
