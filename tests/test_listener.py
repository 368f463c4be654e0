"""The listener's connection bookkeeping (``pairlink._io.listener``), over real TCP: each open
connection gets one handler from ``accept``, made before its first attach is answered (even
one pipelined with the open, LP-10), and told ``on_closed`` once when the connection ends,
leaving the listener too; a connection that never opens gets none."""

from __future__ import annotations

import math

import pytest
import trio

from pairlink._amqp.errors import NOT_FOUND
from pairlink._amqp.framing import AMQP_HEADER, FRAME_SASL, SASL_HEADER, encode_frame
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Error, Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Begin, Open, SaslInit
from pairlink._io.connection import AmqpConnection
from pairlink._io.listener import listen
from pairlink._io.login_throttle import LoginThrottle
from pairlink._io.net import connect
from pairlink.errors import AuthenticationError

URL = "amqp://127.0.0.1:0"


class Handler:
    """One connection's handler: what it heard, in order."""

    def __init__(self, conn: AmqpConnection) -> None:
        self.conn = conn
        self.open_when_made = conn.opened.is_set()
        self.links: list[str] = []
        self.closed = 0
        self.attached = trio.Event()
        self.ended = trio.Event()

    def on_attach(self, link: Link) -> None:
        self.links.append(link.name)
        self.conn.refuse(link, Error(NOT_FOUND, "nothing here"))
        self.attached.set()

    def on_closed(self) -> None:
        self.closed += 1
        self.ended.set()


class Handlers:
    """The ``accept`` of the tests' listeners: keeps every handler it made."""

    def __init__(self) -> None:
        self.made: list[Handler] = []
        self._send, self._receive = trio.open_memory_channel[Handler](math.inf)

    def accept(self, conn: AmqpConnection) -> Handler:
        handler = Handler(conn)
        self.made.append(handler)
        self._send.send_nowait(handler)
        return handler

    async def next(self) -> Handler:
        """The next handler made (in order), once it is."""
        with trio.fail_after(10):
            return await self._receive.receive()


async def test_an_open_connection_gets_one_handler_told_once_of_its_end() -> None:
    handlers = Handlers()
    async with listen(URL, accept=handlers.accept) as listener:
        async with connect(listener.url) as conn:
            handler = await handlers.next()
            assert handler.open_when_made
            assert listener.handlers == {handler.conn: handler}
        with trio.fail_after(10):
            await handler.ended.wait()
        assert not listener.handlers
        assert conn.closed.is_set() and handler.conn.closed.is_set()
    assert handler.closed == 1  # leaving the listener did not tell it again
    assert len(handlers.made) == 1


async def test_an_attach_pipelined_with_the_open_finds_its_handler_made() -> None:
    """SASL, open, begin and attach in one write (LP-10): the listener makes the handler
    when the attach is dispatched, in the same read as the open, and hands it the link."""
    handlers = Handlers()
    async with listen(URL, accept=handlers.accept) as listener:
        out = bytearray(SASL_HEADER)
        encode_frame(out, 0, SaslInit(mechanism="ANONYMOUS"), frame_type=FRAME_SASL)
        out += AMQP_HEADER
        encode_frame(out, 0, Open(container_id="pipelining"))
        encode_frame(out, 0, Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100))
        attach = Attach(
            name="first",
            handle=0,
            role=ROLE_SENDER,
            source=Source(address="here"),
            target=Target(address="there"),
            initial_delivery_count=0,
        )
        encode_frame(out, 0, attach)
        async with await trio.open_tcp_stream("127.0.0.1", listener.port) as stream:
            await stream.send_all(bytes(out))
            handler = await handlers.next()
            with trio.fail_after(10):
                await handler.attached.wait()
            assert handler.open_when_made and handler.links == ["first"]
        with trio.fail_after(10):
            await handler.ended.wait()
    assert handler.closed == 1


async def test_leaving_the_listener_tells_every_handler_before_it_returns() -> None:
    handlers = Handlers()

    async def hold(url: str, *, task_status: trio.TaskStatus[AmqpConnection]) -> None:
        async with connect(url) as conn:
            task_status.started(conn)
            await conn.closed.wait()  # until the listener closes it

    async with trio.open_nursery() as nursery:
        async with listen(URL, accept=handlers.accept) as listener:
            first = await nursery.start(hold, listener.url)
            second = await nursery.start(hold, listener.url)
            made = [await handlers.next(), await handlers.next()]
            assert [handler.closed for handler in made] == [0, 0]
        assert [handler.closed for handler in made] == [1, 1]
        assert not listener.handlers
    assert first.closed.is_set() and second.closed.is_set()


async def test_a_refused_login_gets_no_handler_and_a_handler_knows_its_user() -> None:
    handlers = Handlers()
    async with listen(
        URL,
        accept=handlers.accept,
        users={"alice": "right"},
        login_throttle=LoginThrottle(penalty=0.0),
    ) as listener:
        with pytest.raises(AuthenticationError):
            async with connect(f"amqp://alice:wrong@127.0.0.1:{listener.port}") as conn:
                await conn.wait_opened()
        async with connect(f"amqp://alice:right@127.0.0.1:{listener.port}") as conn:
            await conn.wait_opened()
            handler = await handlers.next()
        assert handler.conn.sasl_identity == "alice"
        assert handlers.made == [handler]  # none for the refused login, before it
