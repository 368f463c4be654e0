"""Dispatch and outcomes over real TCP: every status code, every handler kind, both settle modes.

The common paths go through our own client (``pairlink._client.client``); where the test must choose
the frames (a deadline already past, a body that is garbage, a settle mode), a bare engine.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from pairlink import Client, connect, handler, open_server, service
from pairlink._amqp import errors
from pairlink._amqp.codec import encode_into
from pairlink._amqp.messaging import Accepted, Message, Properties, Rejected
from pairlink._amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_MIXED,
    SND_SETTLED,
    SND_UNSETTLED,
    Detach,
    Transfer,
)
from pairlink._amqp.types import Described, Symbol, ULong
from pairlink._rpc import deadline, wire
from pairlink._rpc.linkpair import paired_properties
from pairlink._rpc.payload import Encoding
from pairlink._server.serving import Server
from pairlink.errors import CallError, RemoteError
from tests.service_peers import RawClient, app_property, raw_client, status


class Unencodable:
    pass


@service("svc", mailbox=8)
class Svc:
    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.gate = trio.Event()

    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

    @handler
    def upper(self, text: str) -> str:
        return text.upper()

    @handler
    def thread_of_def(self) -> bool:
        return threading.current_thread() is threading.main_thread()

    @handler(inline=True)
    def thread_of_inline(self) -> bool:
        return threading.current_thread() is threading.main_thread()

    @handler
    async def thread_of_async(self) -> bool:
        return threading.current_thread() is threading.main_thread()

    @handler
    async def fail(self) -> None:
        raise ValueError("bad value")

    @handler
    async def conflict(self) -> None:
        raise CallError(409, "already there", "Conflict")

    @handler
    async def unencodable(self) -> Unencodable:
        return Unencodable()

    @handler
    async def time_left(self) -> float | None:
        return deadline.remaining()

    @handler
    async def wait(self) -> str:
        await self.gate.wait()
        return "done"

    @handler
    def record(self, x: Any) -> Any:
        self.ran.append(x)
        return x


@pytest.fixture
async def svc() -> Svc:
    return Svc()


@pytest.fixture
async def server(svc: Svc) -> AsyncIterator[Server]:
    async with open_server(svc, listen="amqp://127.0.0.1:0", grace=1) as s:
        yield s


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Client]:
    async with connect(server.url, timeout=5) as c:
        yield c


@pytest.fixture
async def raw(server: Server) -> AsyncIterator[RawClient]:
    async with raw_client(server.url) as c:
        yield c


# -- outcomes through our client ---------------------------------------------------------------


async def test_200_with_the_value(client: Client) -> None:
    calc = await client.service("svc")
    assert await calc.add(2, 3) == 5
    assert await calc.call("add", a=1, b=1) == 2


async def test_404_for_an_unknown_operation(client: Client) -> None:
    with pytest.raises(RemoteError) as exc:
        await client.call("svc", "nope")
    assert exc.value.status == 404 and "nope" in exc.value.message


@pytest.mark.parametrize(
    ("args", "kwargs"), [((1,), {}), ((1, 2, 3), {}), ((1, 2), {"c": 3})], ids=str
)
async def test_400_for_arguments_that_do_not_bind(
    client: Client, svc: Svc, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(RemoteError) as exc:
        await client.call("svc", "add", *args, **kwargs)
    assert exc.value.status == 400 and exc.value.message.startswith("add: ")


async def test_an_unexpected_exception_is_a_500_naming_only_its_reference(
    client: Client,
) -> None:
    with pytest.raises(RemoteError) as exc:
        await client.call("svc", "fail")
    ref = exc.value.ref
    assert ref is not None and len(ref) == 12
    assert (exc.value.status, exc.value.type, exc.value.message) == (
        500,
        None,
        f"internal error (ref {ref})",
    )


async def test_a_handler_chooses_its_status_with_call_error(client: Client) -> None:
    with pytest.raises(RemoteError) as exc:
        await client.call("svc", "conflict")
    assert (exc.value.status, exc.value.type, exc.value.message) == (
        409,
        "Conflict",
        "already there",
    )


async def test_a_result_that_cannot_be_encoded_is_an_undisclosed_500(client: Client) -> None:
    with capture_logs() as logs, pytest.raises(RemoteError) as exc:
        await client.call("svc", "unencodable")
    assert exc.value.status == 500 and exc.value.ref is not None
    assert "Unencodable" not in exc.value.message
    (entry,) = [e for e in logs if e["event"] == "reply.unencodable"]
    assert entry["ref"] == exc.value.ref and "Unencodable" in entry["error"]


async def test_a_plain_def_runs_in_a_thread_unless_inline(client: Client) -> None:
    """The event loop runs in the main thread here: "True" means "on the event loop"."""
    assert await client.call("svc", "upper", "hi") == "HI"
    assert await client.call("svc", "thread_of_def") is False
    assert await client.call("svc", "thread_of_inline") is True
    assert await client.call("svc", "thread_of_async") is True


async def test_the_handler_runs_under_the_request_deadline(
    client: Client, raw: RawClient, io_clock: trio.testing.MockClock
) -> None:
    left = await client.call("svc", "time_left", timeout=3)
    assert left == pytest.approx(3, abs=0.002)  # no time passes: all of it (to the wire's ms)
    sender, _ = raw.pair("svc")
    mid, _ = raw.request(sender, "time_left")  # no deadline at all
    assert wire.parse_reply(await raw.wait_reply(mid)) is None


async def test_many_concurrent_calls_each_get_their_own_reply(client: Client) -> None:
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = await client.call("svc", "record", i)

    async with trio.open_nursery() as nursery:
        for i in range(300):
            nursery.start_soon(one, i)
    assert results == {i: i for i in range(300)}


# -- what only a hand-made request can show -----------------------------------------------------


async def test_408_without_running_when_the_deadline_passed_before_arrival(
    raw: RawClient, svc: Svc
) -> None:
    sender, _ = raw.pair("svc")
    sent_at = deadline.wall_time() - 10
    message = wire.request_message("record", [1], {}, message_id=1, now=sent_at, timeout=1)
    raw.send(sender, message)
    reply = await raw.wait_reply(1)
    assert status(reply) == 408 and svc.ran == []
    assert app_property(reply, wire.STATUS_DESCRIPTION) == "the deadline had passed"


async def test_408_without_running_when_the_deadline_passes_in_the_mailbox(
    raw: RawClient, svc: Svc, io_clock: trio.testing.MockClock
) -> None:
    sender, _ = raw.pair("svc")
    first, _ = raw.request(sender, "wait")
    late, _ = raw.request(sender, "record", 1, timeout=0.2)
    after, _ = raw.request(sender, "nope")  # answered on arrival, so `late` has arrived too
    assert status(await raw.wait_reply(after)) == 404
    assert raw.reply_to(late) is None  # queued behind `wait`, which holds the only worker
    await trio.sleep(0.3)  # the queued call's deadline passes (on the mock clock)
    svc.gate.set()
    reply = await raw.wait_reply(late)
    assert status(reply) == 408
    assert app_property(reply, wire.STATUS_DESCRIPTION) == (
        "the deadline passed while the call was queued"
    )
    assert status(await raw.wait_reply(first)) == 200
    assert svc.ran == []


async def test_a_running_async_handler_is_cancelled_at_its_deadline(
    raw: RawClient, io_clock: trio.testing.MockClock
) -> None:
    sender, _ = raw.pair("svc")
    sent_at = trio.current_time()
    mid, _ = raw.request(sender, "wait", timeout=0.2)
    reply = await raw.wait_reply(mid)
    assert trio.current_time() - sent_at == pytest.approx(0.2, abs=0.002)  # at it, not after
    assert status(reply) == 408
    assert "while it ran" in app_property(reply, wire.STATUS_DESCRIPTION)
    nxt, _ = raw.request(sender, "add", 1, 2)  # the actor is free again
    assert wire.parse_reply(await raw.wait_reply(nxt)) == 3


async def test_400_for_an_undecodable_body(raw: RawClient) -> None:
    sender, _ = raw.pair("svc")
    garbage = Message(
        body=b"\xc1\xc1\xc1",
        body_kind="data",
        properties=Properties(
            message_id=7, reply_to=wire.ME, content_type=Symbol(Encoding.MSGPACK.value)
        ),
        application_properties={wire.OPERATION: "add"},
    )
    raw.send(sender, garbage)
    reply = await raw.wait_reply(7)
    assert status(reply) == 400 and "msgpack" in app_property(reply, wire.STATUS_DESCRIPTION)


@pytest.mark.parametrize("encoding", [Encoding.AMQP_VALUE, Encoding.JSON, Encoding.MSGPACK])
async def test_replies_use_the_request_encoding(raw: RawClient, encoding: Encoding) -> None:
    sender, _ = raw.pair("svc")
    mid, _ = raw.request(sender, "add", 20, 22, encoding=encoding)
    reply = await raw.wait_reply(mid)
    assert wire.parse_reply(reply) == 42
    if encoding is Encoding.AMQP_VALUE:
        assert reply.body_kind == "value"
    else:
        assert reply.properties is not None and reply.properties.content_type == encoding.value


async def test_unsettled_requests_are_accepted_once_answered_even_with_an_error(
    raw: RawClient,
) -> None:
    sender, _ = raw.pair("svc")
    ok, d_ok = raw.request(sender, "add", 1, 2, settled=False)
    bad, d_bad = raw.request(sender, "nope", settled=False)
    await raw.wait_reply(ok)
    await raw.wait_reply(bad)
    await raw.read_until(lambda: d_ok.remote_settled and d_bad.remote_settled)
    assert isinstance(d_ok.remote_state, Accepted) and isinstance(d_bad.remote_state, Accepted)


async def test_a_request_without_reply_to_is_rejected(raw: RawClient, svc: Svc) -> None:
    sender, _ = raw.pair("svc")
    _, delivery = raw.request(sender, "record", 1, reply_to=None, settled=False)
    await raw.read_until(lambda: delivery.remote_settled)
    assert isinstance(delivery.remote_state, Rejected)
    assert delivery.remote_state.error is not None
    assert delivery.remote_state.error.condition == errors.INVALID_FIELD
    assert svc.ran == []


async def test_a_message_that_is_not_amqp_is_rejected_with_decode_error(raw: RawClient) -> None:
    sender, _ = raw.pair("svc")
    delivery = raw.send(sender, b"\x00\x53\x77\xff", settled=False)
    await raw.read_until(lambda: delivery.remote_settled)
    assert isinstance(delivery.remote_state, Rejected)
    assert delivery.remote_state.error is not None
    assert delivery.remote_state.error.condition == errors.DECODE_ERROR


@pytest.mark.parametrize(
    ("properties", "outcome"),
    [
        # not of the type the field needs (Part 3 §3.2.4): not a message, so no reply path
        ([1, None, None, None, ["not", "an", "address"]], errors.DECODE_ERROR),  # reply-to
        ([{"a": 1}, None, None, None, wire.ME], errors.DECODE_ERROR),  # a map as message-id
        ([1, None, None, None, wire.ME, None, None, None, "noon"], errors.DECODE_ERROR),
    ],
    ids=["reply-to-list", "message-id-map", "expiry-string"],
)
async def test_fields_of_illegal_types_never_take_the_server_down(
    raw: RawClient, properties: list[Any], outcome: str | None
) -> None:
    sender, _ = raw.pair("svc")
    body = bytearray()
    encode_into(Described(0x73, properties), body)  # a properties section, field by field
    encode_into(Described(0x74, {wire.OPERATION: "add"}), body)
    encode_into(Described(0x77, [1, 2]), body)
    delivery = raw.send(sender, bytes(body), settled=False)
    await raw.read_until(lambda: delivery.remote_settled)
    assert isinstance(delivery.remote_state, Rejected)
    assert delivery.remote_state.error is not None
    assert delivery.remote_state.error.condition == outcome
    mid, _ = raw.request(sender, "add", 2, 2)  # and the server still serves
    assert wire.parse_reply(await raw.wait_reply(mid)) == 4


def _request_with_a_bad_body(message_id: int) -> bytes:
    body = bytearray()
    encode_into(Described(0x73, [ULong(message_id), None, None, None, wire.ME]), body)
    encode_into(Described(0x74, {wire.OPERATION: "add"}), body)
    return bytes(body) + b"\x00\x53\x77\xff"  # an amqp-value of no AMQP type at all


async def test_a_presettled_request_whose_body_does_not_decode_gets_a_400(
    raw: RawClient, svc: Svc
) -> None:
    sender, _ = raw.pair("svc")
    raw.send(sender, _request_with_a_bad_body(77), settled=True)
    reply = await raw.wait_reply(77)
    assert status(reply) == wire.BAD_REQUEST
    assert "undecodable" in str(app_property(reply, wire.STATUS_DESCRIPTION))
    assert svc.ran == []


async def test_a_presettled_request_with_no_reply_path_detaches_its_link(raw: RawClient) -> None:
    sender, _ = raw.pair("svc")
    body = bytearray()
    encode_into(Described(0x73, [{"a": 1}, None, None, None, wire.ME]), body)  # bad message-id
    encode_into(Described(0x77, [1, 2]), body)
    raw.send(sender, bytes(body), settled=True)
    await raw.read_until(lambda: bool(raw.of(Detach, closed=True)))
    (detach,) = raw.of(Detach, closed=True)
    assert detach.error is not None
    assert detach.error.condition == errors.DECODE_ERROR


@pytest.mark.parametrize(
    ("mode", "request_settled", "settled"),
    [
        (SND_UNSETTLED, True, False),
        (SND_UNSETTLED, False, False),
        (SND_SETTLED, True, True),
        (SND_SETTLED, False, True),
        (SND_MIXED, True, True),  # mixed: the reply mirrors its request
        (SND_MIXED, False, False),
    ],
)
async def test_reply_settlement_follows_the_callers_receiving_link(
    raw: RawClient, mode: int, request_settled: bool, settled: bool
) -> None:
    sender = raw.attach("n", ROLE_SENDER, source="me", target="svc", properties=paired_properties())
    receiver = raw.attach(
        "n",
        ROLE_RECEIVER,
        source="svc",
        target="me",
        properties=paired_properties(),
        snd_settle_mode=mode,
    )
    raw.engine.flow(receiver, 10)
    mid, _ = raw.request(sender, "add", 1, 1, settled=request_settled)
    await raw.wait_reply(mid)
    (transfer,) = raw.of(Transfer)
    assert bool(transfer.settled) is settled


async def test_a_reply_over_the_callers_size_limit_becomes_a_500(raw: RawClient) -> None:
    sender = raw.attach("n", ROLE_SENDER, source="me", target="svc", properties=paired_properties())
    receiver = raw.attach(
        "n",
        ROLE_RECEIVER,
        source="svc",
        target="me",
        properties=paired_properties(),
        max_message_size=300,
    )
    raw.engine.flow(receiver, 10)
    mid, _ = raw.request(sender, "upper", "x" * 1000)
    reply = await raw.wait_reply(mid)
    assert status(reply) == 500
    assert app_property(reply, wire.ERROR_TYPE) == "MessageSizeExceeded"
