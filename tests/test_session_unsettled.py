"""CPU per byte is bounded (issue 22), against a real listening server: a disposition as wide
as ``first=0, last=2^31-1`` over a caller's many unsettled replies costs what it changes (one
that changes nothing visits nothing, counted in keys visited, not timed), and the unsettled
deliveries of a session are bounded both ways by ``Limits.max_session_unsettled``: the
caller's requests by the server's incoming window (past it: ``amqp:session:window-violation``),
the server's replies by waiting until the caller settles some.

Bare engines over real TCP (``tests.service_peers``); frames the engine would never send are
written to the socket by hand."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pairlink import Limits, handler, open_server, service
from pairlink._amqp.errors import WINDOW_VIOLATION
from pairlink._amqp.events import MessageReceived
from pairlink._amqp.framing import encode_frame
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Accepted, Received
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Begin,
    Close,
    Disposition,
    Flow,
    Transfer,
)
from pairlink._amqp.session import MAX_SESSION_UNSETTLED, Session
from pairlink._gateway.config import parse_config
from pairlink._server.serving import Server
from tests.service_peers import RawClient, raw_client, status, wait_for

HELD = 300
WIDEST = 2**31 - 1


@service("work", mailbox=HELD, max_concurrency=64)
class Work:
    def __init__(self) -> None:
        self.permits = trio.Semaphore(0)
        self.started = 0

    @handler(inline=True)
    def echo(self, x: Any) -> Any:
        return x

    @handler
    async def hold(self, i: int) -> int:
        self.started += 1
        await self.permits.acquire()
        return i


@pytest.fixture
async def work() -> Work:
    return Work()


@asynccontextmanager
async def serving(work: Work, **limits: Any) -> AsyncIterator[Server]:
    async with open_server(
        work, listen="amqp://127.0.0.1:0", limits=Limits(**limits), grace=1
    ) as server:
        yield server


def server_session(server: Server) -> Session:
    """The server's end of the one session its callers have with the work service."""
    (origin,) = server.actors["work"].mailbox.links
    session = origin.link.session
    assert isinstance(session, Session)
    return session


def calls(raw: RawClient, operation: str, count: int) -> tuple[Link, Link, list[Any]]:
    """A pair to the work service and ``count`` unsettled calls of ``operation`` queued on it
    (credit presumed): the pair's links, and the calls' message-ids."""
    sender, receiver = raw.pair("work")
    ids = [raw.request(sender, operation, i, settled=False)[0] for i in range(count)]
    return sender, receiver, ids


async def write_raw(raw: RawClient, *performatives: Any) -> None:
    """Frames on our session's channel, written to the socket past our engine."""
    await raw.flush()
    out = bytearray()
    for performative in performatives:
        encode_frame(out, raw.session.channel, performative)
    await raw.stream.send_all(bytes(out))


async def read_all_sent(raw: RawClient, receiver: Link) -> None:
    """Wait until the server has read everything we sent: it echoes our flow only then."""
    echoes = len(raw.of(Flow, handle=receiver.remote_handle))
    raw.engine.flow(receiver, receiver.link_credit, echo=True)
    await raw.read_until(lambda: len(raw.of(Flow, handle=receiver.remote_handle)) > echoes)


def widest(**fields: Any) -> Disposition:
    """The issue's disposition: of every delivery the server may have sent us."""
    return Disposition(role=ROLE_RECEIVER, first=0, last=WIDEST, **fields)


def settle_replies(raw: RawClient) -> int:
    """Settle the replies come so far (again is a no-op); how many have come."""
    received = [e.delivery for e in raw.events if isinstance(e, MessageReceived)]
    for delivery in received:
        if not delivery.settled:
            raw.engine.settle(delivery, Accepted())
    return len(received)


def replies_disposed_by_server(raw: RawClient) -> list[Disposition]:
    return [d for d in raw.dispositions() if d.role is ROLE_SENDER]


def settled_by_server(raw: RawClient) -> int:
    """Replies the server has settled, as its dispositions (ranges) say."""
    return sum(
        1 + ((d.last if d.last is not None else d.first) - d.first)
        for d in replies_disposed_by_server(raw)
        if d.settled
    )


async def test_a_wide_disposition_over_many_unsettled_replies_costs_what_it_changes(
    work: Work,
) -> None:
    async with serving(work) as server, raw_client(server.url) as raw:
        sender, receiver = raw.pair("work", reply_credit=HELD)
        await raw.wait_attached(sender)
        for i in range(HELD):
            await raw.read_until(lambda: sender.link_credit > 0)
            raw.request(sender, "echo", i, settled=False)
        await raw.read_until(lambda: len(raw.replies()) == HELD)
        table = server_session(server).unsettled_out
        assert len(table) == HELD  # the replies we have not settled
        for state in (None, Received(section_number=0, section_offset=0)):
            await write_raw(raw, *[widest(state=state)] * 50)
        await read_all_sent(raw, receiver)
        assert table.visited == 0 and len(table) == HELD  # they changed nothing
        assert replies_disposed_by_server(raw) == []  # (a received state is no outcome)
        await write_raw(raw, *[widest(state=Accepted())] * 50)
        # each reply decided once (the first frame), then settled by the server itself, as
        # rcv-settle-mode second has it: the other 49 find nothing
        await raw.read_until(lambda: settled_by_server(raw) == HELD)
        await read_all_sent(raw, receiver)
        assert table.visited == HELD and len(table) == 0
        await write_raw(raw, *[widest(settled=True)] * 50)
        await read_all_sent(raw, receiver)
        assert table.visited == HELD


async def test_the_servers_window_holds_a_callers_requests_to_the_session_bound(
    work: Work,
) -> None:
    async with serving(work, max_session_unsettled=4) as server, raw_client(server.url) as raw:
        (begin,) = raw.of(Begin)
        assert begin.incoming_window == 4
        _, receiver, ids = calls(raw, "hold", 6)
        await raw.flush()
        await wait_for(lambda: work.started == 4)
        await read_all_sent(raw, receiver)
        # the last two wait in our engine for the window: the server holds four
        assert raw.session.blocked_bytes > 0
        assert server_session(server).unsettled_in.held == 4 and work.started == 4
        for _ in range(6):
            work.permits.release()
        # answered, so settled by the server: the window opens for the last two (whose
        # replies need room under the same bound: we settle the replies as they come)
        await raw.read_until(lambda: settle_replies(raw) == 6)
        assert all(raw.reply_to(mid) is not None for mid in ids)
        assert [status(reply) for reply in raw.replies()] == [200] * 6


async def test_a_caller_sending_past_the_closed_window_breaks_the_connection(
    work: Work,
) -> None:
    async with serving(work, max_session_unsettled=2) as server, raw_client(server.url) as raw:
        sender, _, _ = calls(raw, "hold", 2)
        await raw.flush()
        await wait_for(lambda: work.started == 2)
        tag = b"past"
        await write_raw(raw, Transfer(handle=sender.handle, delivery_id=2, delivery_tag=tag))
        await raw.read_until(lambda: bool(raw.of(Close)))
        (close,) = raw.of(Close)
        assert close.error is not None and close.error.condition == WINDOW_VIOLATION
        for _ in range(2):
            work.permits.release()


async def test_replies_wait_while_the_caller_holds_the_session_bound_unsettled(
    work: Work,
) -> None:
    async with serving(work, max_session_unsettled=4) as server, raw_client(server.url) as raw:
        _, receiver, _ = calls(raw, "echo", 6)
        await raw.read_until(lambda: len(raw.replies()) == 4)
        await wait_for(lambda: server_session(server).starved != set())
        await read_all_sent(raw, receiver)
        assert len(raw.replies()) == 4  # two wait in the server for room
        assert server_session(server).unsettled_out.held == 4
        received = [e.delivery for e in raw.events if isinstance(e, MessageReceived)]
        for delivery in received[:2]:
            raw.engine.settle(delivery, Accepted())
        await raw.read_until(lambda: len(raw.replies()) == 6)
        assert [status(reply) for reply in raw.replies()] == [200] * 6


def test_the_session_bound_is_a_limit_of_the_config_files_too() -> None:
    routes = '[[route]]\npublic = "a"\nupstream = "amqp://h"\naddress = "b"\n'
    text = f'listen = "amqp://h"\n{routes}[limits]\nmax_session_unsettled = 8\n'
    limits = parse_config(text).limits
    assert limits == Limits(max_session_unsettled=8)
    assert limits.listen_options()["max_session_unsettled"] == 8
    assert Limits().max_session_unsettled == MAX_SESSION_UNSETTLED == 16_384
