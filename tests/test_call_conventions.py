"""What a call looks like to the other side (issue 11): the request body chosen by peer, the
arguments convention both ends share, correlation, status-code as an AMQP int, and plain values
out of AMQP bodies and application-properties.

The pure conventions are tested as functions; who gets the envelope is tested over real TCP on
127.0.0.1, asserting on the bytes a :class:`tests.gateway.chain.ByteTap` saw.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import proton
import pytest
import trio

from pairlink import connect, handler, open_server, service
from pairlink._amqp.codec import decode
from pairlink._amqp.messaging import Message, Properties
from pairlink._amqp.performatives import SND_SETTLED, SND_UNSETTLED, Open
from pairlink._amqp.types import (
    Array,
    Byte,
    Char,
    Float32,
    Int,
    Long,
    Short,
    Symbol,
    UByte,
    UInt,
    ULong,
)
from pairlink._rpc.payload import ENVELOPE, Encoding, arguments_value, plain, split_arguments
from pairlink._rpc.wire import (
    CALL_ENVELOPE,
    ERROR_TYPE,
    ME,
    NOT_FOUND,
    OPERATION,
    STATUS_CODE,
    STATUS_DESCRIPTION,
    Request,
    encode_reply,
    encode_request,
    error_message,
    parse_reply,
    parse_request,
    peer_encoding,
    request_message,
)
from pairlink._server.serving import Server
from pairlink.errors import PayloadError, RemoteError
from tests.gateway.chain import LOOPBACK, ByteTap, Chain, open_chain, requests_on

NOW = 1_800_000_000.0

# -- the arguments convention: client and server agree -----------------------------------------

CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    (("hi",), {}),
    ((7,), {}),
    ((1, 2), {}),
    (([1, 2],), {}),  # one list: not the arguments themselves
    (({"a": 1},), {}),  # one map: not keywords
    ((None,), {}),  # one null: not "no arguments"
    ((), {"a": 1, "b": [2]}),
]


@pytest.mark.parametrize("encoding", [Encoding.AMQP_VALUE, Encoding.JSON, Encoding.MSGPACK])
@pytest.mark.parametrize(("args", "kwargs"), CASES)
def test_what_a_client_sends_a_server_reads_back_as_the_same_arguments(
    encoding: Encoding, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    message = Message.decode(
        encode_request("op", args, kwargs, message_id=1, now=NOW, encoding=encoding)
    )
    request = parse_request(message, now=NOW)
    assert (request.args, request.kwargs, request.encoding) == (list(args), kwargs, encoding)


@pytest.mark.parametrize(
    ("args", "kwargs", "body"),
    [
        (("hi",), {}, "hi"),  # one argument: the bare value (Proton's C++ server reads a string)
        ((), {}, None),  # none: null
        ((1, 2), {}, [1, 2]),  # several: a list
        ((), {"name": "x"}, {"name": "x"}),  # keywords: a map
        (([1, 2],), {}, [[1, 2]]),
        (({"a": 1},), {}, [{"a": 1}]),
        ((None,), {}, [None]),
    ],
)
def test_the_amqp_value_body_a_foreign_server_gets(
    args: tuple[Any, ...], kwargs: dict[str, Any], body: Any
) -> None:
    assert arguments_value(args, kwargs, Encoding.AMQP_VALUE) == body
    wire_message = Message.decode(
        encode_request("op", args, kwargs, message_id=1, now=NOW, encoding=Encoding.AMQP_VALUE)
    )
    assert (wire_message.body_kind, wire_message.body) == ("value", body)
    assert wire_message.properties is not None and wire_message.properties.content_type is None


def test_positional_and_keyword_arguments_together_need_the_envelope() -> None:
    with pytest.raises(PayloadError, match="not both"):
        arguments_value((1,), {"a": 2}, Encoding.AMQP_VALUE)
    value = arguments_value((1,), {"a": 2}, Encoding.ENVELOPE)
    assert split_arguments(value, Encoding.ENVELOPE) == ([1], {"a": 2})


def test_one_bytes_argument_goes_as_a_raw_body() -> None:
    message = Message.decode(
        encode_request("op", (b"\x01\x02",), {}, message_id=1, now=NOW, encoding=Encoding.RAW)
    )
    assert (message.body_kind, message.body) == ("data", b"\x01\x02")
    assert parse_request(message, now=NOW).args == [b"\x01\x02"]


def test_the_envelope_goes_only_to_a_peer_that_offers_it() -> None:
    assert peer_encoding([str(CALL_ENVELOPE), "LINK_PAIR_V1_0"]) is Encoding.ENVELOPE
    assert peer_encoding(["LINK_PAIR_V1_0"]) is Encoding.AMQP_VALUE
    assert peer_encoding([]) is Encoding.AMQP_VALUE


# -- correlation ----------------------------------------------------------------------------


@pytest.mark.parametrize("message_id", [7, "call-7", uuid.UUID(int=7)])
def test_a_request_carries_its_message_id_as_its_correlation_id_too(message_id: Any) -> None:
    fast = Message.decode(encode_request("op", (), {}, message_id=message_id, now=NOW))
    built = request_message("op", (), {}, message_id=message_id, now=NOW)
    for message in (fast, built):
        assert message.properties is not None
        assert message.properties.message_id == message_id
        assert message.properties.correlation_id == message_id


# -- status-code: an int on the wire, any integer read -------------------------------------------


def _request(encoding: Encoding = Encoding.AMQP_VALUE) -> Request:
    return Request("op", [], {}, 3, ME, encoding, None, Message())


def _status_as_proton_reads_it(payload: bytes) -> Any:
    message = proton.Message()
    message.decode(payload)
    props: Any = message.properties  # Proton's annotations say None here
    return props[STATUS_CODE]


def test_status_code_is_an_amqp_int_in_successes_and_failures() -> None:
    ok = encode_reply(_request(), "x", to=ME)
    failed = error_message(_request(), NOT_FOUND, "no such thing", to=ME).encode()
    for payload, status in ((ok, 200), (failed, 404)):
        app = Message.decode(payload).application_properties
        assert app is not None and type(app[STATUS_CODE]) is Int and app[STATUS_CODE] == status
        read = _status_as_proton_reads_it(payload)
        assert isinstance(read, proton.int32) and read == status  # what azure-uamqp insists on


def _reply(status: Any, body: Any = None, **app: Any) -> Message:
    return Message.decode(
        Message(
            properties=Properties(correlation_id=3),
            application_properties={STATUS_CODE: status, **app},
            body=body,
        ).encode()
    )


@pytest.mark.parametrize("status", [UInt(200), ULong(200), Short(200), UByte(200), Long(200)])
def test_any_integer_type_of_status_code_is_read(status: int) -> None:
    assert parse_reply(_reply(status, "fine")) == "fine"


@pytest.mark.parametrize("status", [UInt(404), Int(404), Byte(100)])
def test_a_failure_status_is_a_plain_int_whatever_its_wire_type(status: int) -> None:
    reply = _reply(
        status,
        **{STATUS_DESCRIPTION: Symbol("gone"), ERROR_TYPE: Symbol("KeyError")},
    )
    with pytest.raises(RemoteError) as caught:
        parse_reply(reply)
    assert type(caught.value.status) is int and caught.value.status == int(status)
    assert str(caught.value) == f"[{int(status)}] KeyError: gone"  # not [UInt(404)]
    assert type(caught.value.message) is str and type(caught.value.type) is str


def test_a_status_code_that_is_no_integer_is_a_400() -> None:
    for status in (True, "200", 200.0):
        with pytest.raises(RemoteError) as caught:
            parse_reply(_reply(status))
        assert caught.value.status == 400


# -- plain values -----------------------------------------------------------------------------


def test_results_from_amqp_bodies_are_plain_python_values() -> None:
    when = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    ident = uuid.UUID(int=42)
    body = {
        Symbol("sum"): UInt(3),
        "all": Array([ULong(1), ULong(2)]),
        "float": Float32(0.5),
        "char": Char("c"),
        "nested": [{UByte(1): [Short(-2), Symbol("s")]}],
        "kept": [when, ident, None, True, b"\x00"],
    }
    value = parse_reply(_reply(UInt(200), body))
    assert value == {
        "sum": 3,
        "all": [1, 2],
        "float": 0.5,
        "char": "c",
        "nested": [{1: [-2, "s"]}],
        "kept": [when, ident, None, True, b"\x00"],
    }
    exact_types = []

    def walk(v: Any) -> None:
        exact_types.append(type(v))
        if isinstance(v, list):
            for item in v:
                walk(item)
        elif isinstance(v, dict):
            for key, item in v.items():
                walk(key)
                walk(item)

    walk(value)
    allowed = {dict, list, str, int, float, bool, bytes, type(None), datetime.datetime, uuid.UUID}
    assert set(exact_types) <= allowed


def test_handler_arguments_from_an_amqp_value_are_plain() -> None:
    message = Message.decode(
        Message(
            properties=Properties(message_id=1, reply_to=ME),
            application_properties={OPERATION: Symbol("op")},
            body=[UInt(1), Array([Symbol("a")]), {Symbol("k"): Float32(1.5)}],
        ).encode()
    )
    request = parse_request(message, now=NOW)
    assert type(request.operation) is str
    assert request.args == [1, ["a"], {"k": 1.5}]
    assert [type(a) for a in request.args] == [int, list, dict]
    assert type(request.args[1][0]) is str and type(next(iter(request.args[2]))) is str


def test_a_sequence_body_is_plain_too() -> None:
    message = Message.decode(
        Message(body=[[UInt(1)], [Symbol("x")]], body_kind="sequence").encode()
    )
    request_value = parse_reply(message)
    assert request_value == [1, "x"] and [type(v) for v in request_value] == [int, str]


def test_plain_leaves_message_ids_to_correlation() -> None:
    """Only bodies and statuses are made plain: the ids stay as sent, so a reply's
    correlation-id still equals the message-id of its request, whatever its type."""
    message = Message(
        properties=Properties(message_id=ULong(5)), application_properties={OPERATION: "op"}
    )
    request = parse_request(Message.decode(message.encode()), now=NOW)
    assert type(request.message_id) is ULong


def test_plain_of_what_has_no_plainer_form_is_itself() -> None:
    for value in (datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC), uuid.UUID(int=1)):
        assert plain(value) is value
    assert plain(decode(b"\xa3\x01s")) == "s" and type(plain(decode(b"\xa3\x01s"))) is str


# -- who gets the envelope: over TCP -----------------------------------------------------------


@service("kinds")
class Kinds:
    """Tells what its arguments arrived as."""

    @handler
    def kinds(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [
            [type(a).__name__ for a in args],
            sorted((k, type(v).__name__) for k, v in kwargs.items()),
        ]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with open_server(Kinds, listen=f"amqp://{LOOPBACK}:0", grace=1) as s:
        yield s


async def _tapped(nursery: trio.Nursery, port: int) -> ByteTap:
    tap: ByteTap = await nursery.start(ByteTap("client-server", port).run)
    return tap


async def test_pairlink_to_pairlink_sends_the_envelope(server: Server) -> None:
    async with trio.open_nursery() as nursery:
        tap = await _tapped(nursery, server.port)
        async with connect(tap.url) as client:
            # positional and keyword arguments together: only the envelope carries both
            assert await client.call("kinds", "kinds", 1, "a", flag=True) == [
                ["int", "str"],
                [["flag", "bool"]],
            ]
        nursery.cancel_scope.cancel()
    (request,) = requests_on(tap.up(), "kinds")
    props = request.message.properties
    assert props is not None and props.content_type == ENVELOPE
    (server_open,) = tap.down().of(Open)
    assert CALL_ENVELOPE in server_open.offered_capabilities


@pytest.mark.parametrize("where", ["connect", "service", "call"])
async def test_an_explicit_encoding_wins_over_the_peers_offer(server: Server, where: str) -> None:
    options: dict[str, Any] = {"encoding": Encoding.AMQP_VALUE}
    async with trio.open_nursery() as nursery:
        tap = await _tapped(nursery, server.port)
        async with connect(tap.url, **(options if where == "connect" else {})) as client:
            proxy = await client.service("kinds", **(options if where == "service" else {}))
            if where == "call":
                result = await client.call("kinds", "kinds", "x", encoding=Encoding.AMQP_VALUE)
            else:
                result = await proxy.kinds("x")
            assert result == [["str"], []]
        nursery.cancel_scope.cancel()
    (request,) = requests_on(tap.up(), "kinds")
    message = request.message
    assert message.body_kind == "value" and message.body == "x"
    assert message.properties is not None and message.properties.content_type is None


@pytest.mark.parametrize(("settled", "mode"), [(True, SND_SETTLED), (False, SND_UNSETTLED)])
async def test_our_client_asks_for_its_replies_settlement_explicitly(
    server: Server, settled: bool, mode: int
) -> None:
    """Never ``mixed``: what our client gets does not depend on a service mirroring it."""
    async with trio.open_nursery() as nursery:
        tap = await _tapped(nursery, server.port)
        async with connect(tap.url, settled=settled) as client:
            assert await client.call("kinds", "kinds") == [[], []]
        nursery.cancel_scope.cancel()
    attaches = tap.up().attaches()
    assert len(attaches) == 2 and {a.snd_settle_mode for a in attaches} == {mode}
    replies = [m for m in tap.down().messages if m.correlation_id is not None]
    assert [m.settled for m in replies] == [settled]


async def test_through_the_gateway_chain_calls_still_travel_in_the_envelope() -> None:
    """Both gateways offer the envelope as the container behind them does: the client's
    request reaches the service as the envelope, byte for byte the same on every hop."""
    chain: Chain
    async with open_chain() as chain, connect(chain.url) as client:
        echo = await client.service("billing")
        assert await echo.echo({"k": [1, b"\x00"]}) == {"k": [1, b"\x00"]}
        for tap in chain.taps:
            (request,) = requests_on(tap.up(), "echo")
            props = request.message.properties
            assert props is not None and props.content_type == ENVELOPE, tap
        assert len({requests_on(tap.up(), "echo")[0].bare for tap in chain.taps}) == 1
