"""Our AMQP stack against Apache Qpid Proton over real TCP on 127.0.0.1, both ways round.

(a) a Proton container listens, our client talks to it; (b) our listener, Proton clients (a
``MessagingHandler`` container and a ``BlockingConnection``); (c) TLS both ways; (d) a silent
peer is found by the idle timeout, and a quiet but live one is kept alive by heartbeats;
(e) a wrong password gets the SASL auth outcome.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pairlink._amqp import errors
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Accepted, Message, Properties, Rejected
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import (
    Receiver,
    Sender,
    accept_receiver,
    accept_sender,
    open_receiver,
    open_sender,
)
from pairlink._io.listener import Listener, listen
from pairlink._io.net import connect
from pairlink.errors import AuthenticationError, ConnectionLostError
from tests.interop.proton_peers import (
    ProtonServer,
    blocking_receive,
    blocking_send,
    make_messages,
    run_client,
    sasl_plain_server_available,
)
from tests.listening import EachLink, answering
from tests.tls import TlsFiles

BIG = 1 << 20
COUNT = 1000
BIG_INDEX = 500

_NO_PLAIN = sasl_plain_server_available()
_WHY = f"Proton cannot serve SASL PLAIN here: {_NO_PLAIN}"
needs_plain_server = pytest.mark.skipif(_NO_PLAIN is not None, reason=_WHY)


def our_messages(count: int = COUNT) -> list[Message]:
    return [
        Message(
            body=b"x" * BIG if i == BIG_INDEX else f"m{i}".encode(),
            body_kind="data",
            properties=Properties(message_id=f"ours-{i}"),
            application_properties={"index": i},
        )
        for i in range(count)
    ]


async def send_all(sender: Sender, messages: list[Message]) -> list[Any]:
    """Send every message concurrently (credit bounds what is in flight); return outcomes."""
    outcomes: list[Any] = [None] * len(messages)

    async def one(i: int) -> None:
        outcomes[i] = (await sender.send(messages[i])).remote_state

    async with trio.open_nursery() as nursery:
        for i in range(len(messages)):
            nursery.start_soon(one, i)
    return outcomes


async def receive_n(receiver: Receiver, n: int) -> list[Message]:
    got = []
    for _ in range(n):
        item = await receiver.receive()
        receiver.settle(item, Accepted())
        got.append(item.message)
    return got


def check_received_by_proton(server: ProtonServer) -> None:
    received = server.wait_for_messages(COUNT)
    assert len(received) == COUNT
    by_id = {r.message.id: r.message for r in received}
    assert set(by_id) == {f"ours-{i}" for i in range(COUNT)}
    assert len(memoryview(by_id[f"ours-{BIG_INDEX}"].body)) == BIG  # type: ignore[arg-type]
    assert by_id["ours-7"].properties == {"index": 7}


# -- (a) Proton listens, our client -----------------------------------------------------------


async def _our_client_round_trip(server: ProtonServer, url: str) -> None:
    async with connect(url) as conn:
        await conn.wait_opened()
        sender = open_sender(conn, "inbox")
        receiver = open_receiver(conn, "outbox", credit=50)
        outcomes = await send_all(sender, our_messages())
        assert all(isinstance(o, Accepted) for o in outcomes), outcomes[:3]
        proton_out = make_messages(20, big_index=3)
        async with trio.open_nursery() as nursery:
            got: list[Message] = []

            async def take() -> None:
                got.extend(await receive_n(receiver, 20))

            nursery.start_soon(take)
            sent = await trio.to_thread.run_sync(server.send, "outbox", proton_out)
        assert sent == ["accepted"] * 20
        assert [m.properties.message_id if m.properties else None for m in got] == [
            f"m-{i}" for i in range(20)
        ]
        assert len(got[3].body) == BIG
    check_received_by_proton(server)


async def test_a_our_client_to_proton_server_sasl_anonymous() -> None:
    with ProtonServer(mechanisms=["ANONYMOUS"]) as server:
        await _our_client_round_trip(server, server.url())
        (peer,) = server.connections
        assert peer.sasl_mechanism == "ANONYMOUS"


@needs_plain_server
async def test_a_our_client_to_proton_server_sasl_plain() -> None:
    with ProtonServer(mechanisms=["PLAIN"], users={"alice": "pw-a"}) as server:
        await _our_client_round_trip(server, server.url("alice", "pw-a"))
        (peer,) = server.connections
        assert peer.sasl_mechanism == "PLAIN" and peer.sasl_user == "alice"


async def test_a_rejected_outcome_from_proton_reaches_our_sender() -> None:
    with ProtonServer(disposition=lambda _msg: "reject") as server:
        async with connect(server.url()) as conn:
            delivery = await open_sender(conn, "inbox").send(Message(body="no"))
            assert isinstance(delivery.remote_state, Rejected)


# -- (b) our listener, Proton clients ---------------------------------------------------------


class Node:
    """Our side of (b): keeps what peers send, feeds peers that receive from ``outbox``."""

    def __init__(self, nursery: trio.Nursery, to_send: int = 0) -> None:
        self.nursery = nursery
        self.to_send = to_send
        self.got: list[Message] = []

    def on_attach(self, conn: AmqpConnection, link: Link) -> None:
        if link.is_receiver:
            self.nursery.start_soon(self._keep, accept_receiver(conn, link, credit=100))
        else:
            self.nursery.start_soon(self._feed, accept_sender(conn, link))

    async def _keep(self, receiver: Receiver) -> None:
        async for item in receiver:
            self.got.append(item.message)
            receiver.settle(item, Accepted())

    async def _feed(self, sender: Sender) -> None:
        for i in range(self.to_send):
            body = b"y" * BIG if i == 2 else f"ours-{i}".encode()
            await sender.send(
                Message(body=body, body_kind="data", properties=Properties(message_id=i)),
                wait=False,
            )


@asynccontextmanager
async def our_server(
    to_send: int = 0, **kwargs: Any
) -> AsyncIterator[tuple[Listener[EachLink], Node]]:
    async with trio.open_nursery() as nursery:
        node = Node(nursery, to_send)
        async with listen(
            "amqp://127.0.0.1:0", accept=answering(node.on_attach), **kwargs
        ) as listener:
            yield listener, node
        nursery.cancel_scope.cancel()


def check_received_by_us(node: Node) -> None:
    assert len(node.got) == COUNT
    ids = {m.properties.message_id if m.properties else None for m in node.got}
    assert ids == {f"m-{i}" for i in range(COUNT)}
    assert sum(1 for m in node.got if len(m.body) == BIG) == 1


async def test_b_proton_messaging_handler_client_to_our_listener() -> None:
    async with our_server(to_send=10) as (listener, node):
        result = await trio.to_thread.run_sync(
            functools.partial(
                run_client,
                listener.url,
                send_to="inbox",
                messages=make_messages(COUNT, big_index=BIG_INDEX),
                receive_from="outbox",
                expect=10,
            )
        )
        assert result.error is None
        assert result.outcomes == ["accepted"] * COUNT
        assert [m.id for m in result.received] == list(range(10))
        assert len(memoryview(result.received[2].body)) == BIG  # type: ignore[arg-type]
        check_received_by_us(node)


@pytest.mark.timeout(120)
async def test_b_proton_blocking_connection_to_our_listener() -> None:
    async with our_server(to_send=5) as (listener, node):
        outcomes = await trio.to_thread.run_sync(
            blocking_send, listener.url, "inbox", make_messages(COUNT, big_index=BIG_INDEX)
        )
        assert outcomes == ["accepted"] * COUNT
        check_received_by_us(node)
        got = await trio.to_thread.run_sync(blocking_receive, listener.url, "outbox", 5)
        assert [m.id for m in got] == list(range(5))


@needs_plain_server
async def test_b_proton_client_with_sasl_plain_to_our_listener() -> None:
    async with our_server(users={"bob": "pw-b"}) as (listener, node):
        result = await trio.to_thread.run_sync(
            functools.partial(
                run_client,
                listener.url,
                send_to="inbox",
                messages=make_messages(3),
                user="bob",
                password="pw-b",
                mechanisms="PLAIN",
            )
        )
        assert result.error is None and result.outcomes == ["accepted"] * 3
        assert len(node.got) == 3


# -- (c) TLS both ways ------------------------------------------------------------------------


async def test_c_our_client_to_proton_over_tls(tls_files: TlsFiles) -> None:
    with ProtonServer(tls=tls_files) as server:
        url = server.url().replace("amqp://", "amqps://")
        async with connect(url, ssl_context=tls_files.client_context()) as conn:
            outcomes = await send_all(open_sender(conn, "inbox"), our_messages(50))
        assert all(isinstance(o, Accepted) for o in outcomes)
        assert len(server.wait_for_messages(50)) == 50


async def test_c_proton_client_to_our_listener_over_tls(tls_files: TlsFiles) -> None:
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        async with listen(
            "amqps://127.0.0.1:0",
            accept=answering(node.on_attach),
            ssl_context=tls_files.server_context(),
        ) as listener:
            result = await trio.to_thread.run_sync(
                functools.partial(
                    run_client,
                    listener.url,
                    send_to="inbox",
                    messages=make_messages(50),
                    tls=tls_files,
                )
            )
            assert result.error is None and result.outcomes == ["accepted"] * 50
            assert len(node.got) == 50
        nursery.cancel_scope.cancel()


# -- (d) idle timeout -------------------------------------------------------------------------


class FreezableRelay:
    """A TCP relay on 127.0.0.1 that can go silent: after ``freeze()`` it swallows every byte
    both ways, as a dead peer or a cut network would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen = False
        self.port = 0

    def freeze(self) -> None:
        self.frozen = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, client, upstream)
            nursery.start_soon(self._pipe, upstream, client)

    async def _pipe(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
        while data := await src.receive_some(65536):
            if not self.frozen:
                await dst.send_all(data)


async def test_d_a_silent_proton_peer_is_detected_by_our_idle_timeout() -> None:
    with ProtonServer() as server:
        relay = FreezableRelay(server.port)
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            with pytest.raises(ConnectionLostError) as exc:
                async with connect(f"amqp://127.0.0.1:{relay.port}", idle_timeout=1.0) as conn:
                    await conn.wait_opened()
                    await open_sender(conn, "inbox").send(Message(body="before"))
                    relay.freeze()
                    start = trio.current_time()
                    await conn.closed.wait()
                    elapsed = trio.current_time() - start
                    conn.raise_if_closed()
            assert 0.9 <= elapsed < 3.0
            assert exc.value.condition == errors.RESOURCE_LIMIT_EXCEEDED or "idle" in str(exc.value)
            nursery.cancel_scope.cancel()


async def test_d_our_heartbeats_keep_an_idle_proton_connection_alive() -> None:
    """Proton asks for traffic every 0.5 s (idle-time-out 1 s halved); we stay quiet for 3 s
    of application silence and the connection still works: our heartbeats kept it."""
    with ProtonServer(idle_timeout=1.0) as server:
        async with connect(server.url(), idle_timeout=None) as conn:
            await conn.wait_opened()
            await trio.sleep(3)
            delivery = await open_sender(conn, "inbox").send(Message(body="still here"))
            assert isinstance(delivery.remote_state, Accepted)
        assert not server.errors


# -- (e) wrong password -----------------------------------------------------------------------


@needs_plain_server
async def test_e_wrong_password_to_proton_is_refused_at_sasl() -> None:
    with ProtonServer(mechanisms=["PLAIN"], users={"alice": "right"}) as server:
        with pytest.raises(AuthenticationError) as exc:
            async with connect(server.url("alice", "wrong")) as conn:
                await conn.wait_opened()
        assert exc.value.condition == errors.UNAUTHORIZED_ACCESS


async def test_e_proton_with_a_wrong_password_is_refused_by_our_listener() -> None:
    async with our_server(users={"bob": "right"}) as (listener, node):
        result = await trio.to_thread.run_sync(
            functools.partial(
                run_client,
                listener.url,
                send_to="inbox",
                messages=make_messages(1),
                user="bob",
                password="wrong",
                mechanisms="PLAIN",
                timeout=10,
            )
        )
        assert result.error is not None and "unauthorized-access" in result.error
        assert node.got == []
