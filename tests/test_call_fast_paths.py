"""The fast paths of a call's messages give exactly what the general paths give, for any bytes.

A service reads each request with ``wire.read_request`` (the fast path ``wire.REQUEST``),
without the message, and any message in the layout our client writes through ``Message.decode``
in one pass (``messaging.USUAL_MESSAGE``); a client reads each reply's id and value with
``wire.read_reply`` (``wire.REPLY``), without the message. The layouts live in
``pairlink._amqp.call_layout``; the general paths are reached by switching a fast path off
through its registry (``pairlink._amqp.fast_paths``). Each is compared here with the general
path on the bytes our encoders write (which they must take) and on those bytes damaged:
flipped, cut short or extended, where they must give the general path's result or step aside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pairlink import RemoteError, Reply, connect, open_server
from pairlink._amqp import messaging
from pairlink._amqp.messaging import Message
from pairlink._rpc import batch, wire
from pairlink._rpc.payload import Encoding
from pairlink.errors import CallError, PayloadError
from services.echo import Echo

IDS = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 255, 256, 2**64 - 1]),
    st.text(max_size=40),
)
VALUES = st.one_of(
    st.binary(max_size=300),
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=20),
    st.lists(st.integers(0, 9), max_size=5),
    st.none(),
)
NOW = 1_763_900_000.0


@st.composite
def damaged(draw: st.DrawFn, payload: bytes) -> bytes:
    """``payload`` as is, or with one byte changed, cut short, or with bytes after it."""
    how = draw(st.sampled_from(["as is", "flip", "cut", "extend"]))
    if how == "flip":
        at = draw(st.integers(0, len(payload) - 1))
        byte = draw(st.integers(0, 255))
        return payload[:at] + bytes((byte,)) + payload[at + 1 :]
    if how == "cut":
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if how == "extend":
        return payload + draw(st.binary(min_size=1, max_size=8))
    return payload


def _general_decode(payload: bytes) -> Any:
    with messaging.USUAL_MESSAGE.off():
        return _outcome(Message.decode, payload)


def _outcome(read: Any, payload: bytes) -> Any:
    try:
        message = read(payload)
    except Exception as exc:  # the two must fail alike, whatever the failure
        return ("error", type(exc), str(exc))
    properties = message.properties
    fields = attrs.astuple(properties, recurse=False) if properties is not None else ()
    return ("ok", message, [type(f) for f in fields], type(message.body))


@st.composite
def requests(draw: st.DrawFn, usual: bool = False) -> bytes:
    """A request as our client writes it, maybe damaged; ``usual``: mostly in the layout our
    client writes to a pairlink service (our envelope, a deadline, a short reply-to)."""
    encodings = [Encoding.ENVELOPE] * 15 + [Encoding.BATCH] * 5 if usual else []
    encodings += list(Encoding)
    timeouts = [0.0001, 0.2, 30.0, 1e6] + ([] if usual else [None])
    reply_tos = [wire.ME, "reply/1"] * 4 + [None, "ü" * 300]
    encoding = draw(st.sampled_from(encodings))
    args: list[Any]
    if encoding is Encoding.RAW:
        args = [draw(st.binary())]
    elif encoding is Encoding.BATCH:  # its rows, packed: the one argument
        rows = draw(st.lists(st.lists(VALUES, max_size=3), max_size=4))
        try:
            packed = list(batch.packed(((row, {}) for row in rows), 256, 1 << 18))
        except PayloadError:
            assume(False)
        args = [packed[0].body if packed else b"\x90"]
    else:
        args = draw(st.lists(VALUES, max_size=3))
    kwargs = {}
    if encoding is Encoding.ENVELOPE:
        kwargs = draw(st.dictionaries(st.sampled_from(["a", "b"]), VALUES, max_size=2))
    try:
        payload = wire.encode_request(
            draw(st.sampled_from(["echo", "add", "é"])),
            args,
            kwargs,
            message_id=draw(IDS),
            now=NOW,
            timeout=draw(st.sampled_from(timeouts)),
            reply_to=draw(
                st.sampled_from(reply_tos if usual else [wire.ME, None, "reply/1", "ü" * 300])
            ),
            encoding=encoding,
        )
    except (ValueError, OverflowError, TypeError):  # a value the body's encoding cannot hold
        assume(False)
    return draw(damaged(payload))


@settings(max_examples=400, deadline=None)
@given(requests())
def test_request_decode_matches_the_general_path(payload: bytes) -> None:
    assert _outcome(Message.decode, payload) == _general_decode(payload)


def test_usual_request_takes_the_fast_path() -> None:
    payload = wire.encode_request("echo", (b"x" * 64,), {}, message_id=12345, now=NOW, timeout=30.0)
    with messaging.USUAL_MESSAGE.recorded() as taken:
        quick = Message.decode(payload)
    assert taken == [True]
    assert quick is not None
    assert _outcome(lambda _p: quick, payload) == _general_decode(payload)


def _general_request(payload: bytes) -> Any:
    """What a service made of ``payload`` before ``read_request``: the message, decoded by the
    general path, and the request ``parse_request`` reads from it (None: refused)."""
    with messaging.USUAL_MESSAGE.off():
        try:
            message = Message.decode(payload)
            return message, wire.parse_request(message, now=NOW)
        except Exception:  # the fast path must step aside for anything the general one refuses
            return None


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_request_read_matches_the_general_path(data: st.DataObject) -> None:
    payload = data.draw(requests(usual=True))
    quick = wire.read_request(payload)
    general = _general_request(payload)
    if quick is None:
        return
    assert general is not None
    message, request = general
    assert _unread(quick)  # no message built ...
    assert quick.application_properties == message.application_properties
    assert _unread(quick)
    fields = ("operation", "args", "kwargs", "message_id", "reply_to", "encoding", "deadline")
    for field in fields:
        assert getattr(quick, field) == getattr(request, field), field
        assert type(getattr(quick, field)) is type(getattr(request, field)), field
    assert quick.message == message  # ... until something asks for it
    assert not _unread(quick)


def _unread(request: wire.Request) -> bool:
    """Whether ``request`` still holds its bytes, its message not yet decoded."""
    return isinstance(request.source, bytes)


@pytest.mark.parametrize("message_id", [0, 7, 2**64 - 1, "", "call-1", "é" * 40])
@pytest.mark.parametrize("kwargs", [{}, {"a": 1, "b": [b"x"]}])
def test_usual_requests_are_read_without_their_message(message_id: Any, kwargs: Any) -> None:
    payload = wire.encode_request(
        "echo", (b"x" * 64, None), kwargs, message_id=message_id, now=NOW, timeout=30.0
    )
    quick = wire.read_request(payload)
    assert quick is not None and _unread(quick)
    assert (quick.args, quick.kwargs, quick.message_id) == ([b"x" * 64, None], kwargs, message_id)
    assert quick.deadline == NOW + 30.0


@pytest.mark.parametrize(
    ("why", "options"),
    [
        ("no deadline", {"timeout": None}),
        ("no reply-to", {"reply_to": None}),
        ("not our envelope", {"encoding": Encoding.MSGPACK}),
        ("a trace beside the operation", {"headers": {"traceparent": "00-" + "1" * 32}}),
    ],
)
def test_other_requests_are_left_to_the_general_path(why: str, options: Any) -> None:
    settings: dict[str, Any] = {"timeout": 30.0, **options}
    payload = wire.encode_request("echo", (1,), {}, message_id=1, now=NOW, **settings)
    assert wire.read_request(payload) is None, why
    assert _general_request(payload) is not None


@pytest.mark.parametrize("cut", range(1, 5))
def test_a_body_cut_inside_its_size_is_left_to_the_general_path(cut: int) -> None:
    """A data section whose four-byte size is cut short: refused by the general path (a 400
    for the caller), never an exception out of the fast one."""
    payload = wire.encode_request("echo", (b"x" * 300,), {}, message_id=1, now=NOW, timeout=30.0)
    at = payload.rindex(b"\x00\x53\x75\xb0") + 4  # the body's vbin32 size
    damaged = payload[: at + 4 - cut]
    assert wire.read_request(damaged) is None
    assert _general_request(damaged) is None


def test_an_envelope_that_is_not_one_is_left_to_the_general_path() -> None:
    """A body the general path answers with a 400: the fast path must not read it."""
    payload = wire.encode_request("echo", (1,), {}, message_id=1, now=NOW, timeout=30.0)
    body = b"\x92\x91\x01\x80"  # [[1], {}] as msgpack
    assert payload.endswith(body)
    for bad in (b"\x91\x01", b"\x92\x01\x80", b"\x92\x91\x01\x81\x01\x02"):  # [1]; [1, {}]; {1: 2}
        damaged = payload[: -len(body) - 1] + bytes((len(bad),)) + bad
        assert wire.read_request(damaged) is None
        with pytest.raises(CallError):
            wire.parse_request(Message.decode(damaged), now=NOW)


def _general_reply(payload: bytes) -> Any:
    try:
        message = Message.decode(payload)
        properties = message.properties
        correlation_id = properties.correlation_id if properties is not None else None
        return correlation_id, wire.parse_reply(message)
    except Exception:  # the fast path must step aside for anything the general one refuses
        return None


@st.composite
def replies(draw: st.DrawFn) -> tuple[bytes, bool]:
    encoding = draw(st.sampled_from(list(Encoding)))
    request = wire.Request("echo", [], {}, draw(IDS), None, encoding, None, Message())
    to = draw(st.sampled_from([wire.ME, None, "reply/1"]))
    value = draw(VALUES)
    try:
        payload = wire.encode_reply(request, value, to=to)
    except (ValueError, OverflowError, TypeError):  # a value the body's encoding cannot hold
        assume(False)
    usual = encoding in (Encoding.ENVELOPE, Encoding.MSGPACK) and to != "reply/1"
    damaged_payload = draw(damaged(payload))
    return damaged_payload, usual and damaged_payload == payload


@settings(max_examples=400, deadline=None)
@given(replies())
def test_reply_read_matches_the_general_path(case: tuple[bytes, bool]) -> None:
    payload, usual = case
    quick = wire.read_reply(payload)
    if usual:
        assert quick is not None
    if quick is not None:
        assert quick == _general_reply(payload)
        assert type(quick[0]) in (int, str)


def test_failure_reply_is_left_to_the_general_path() -> None:
    request = wire.Request("echo", [], {}, 7, None, Encoding.ENVELOPE, None, Message())
    payload = wire.error_message(request, wire.NOT_FOUND, "no such operation", to=wire.ME)
    assert wire.read_reply(payload.encode()) is None


async def test_calls_and_requests_share_a_pair_each_read_its_own_way(
    fast_reads: Callable[[str], list[bool]],
) -> None:
    """Over real TCP: a call's reply is read by ``read_reply``, a ``request``'s on the same
    pair whole (it wants the message), a failure through the general path, all in flight
    together, every one matched to its caller."""
    read = fast_reads("reply")
    async with (
        open_server(Echo, listen="amqp://127.0.0.1:0") as server,
        connect(server.url, timeout=10) as client,
    ):
        echo = await client.service("echo")
        values: dict[int, Any] = {}
        replies: dict[int, Reply] = {}

        async def call(i: int) -> None:
            values[i] = await echo.echo([i, "x" * i])

        async def request(i: int) -> None:
            replies[i] = await client.request(
                "echo", [i], application_properties={"operation": "nope"}
            )

        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(call, i)
                if i % 10 == 0:
                    nursery.start_soon(request, i)
        with pytest.raises(RemoteError):
            await echo.call("no-such-operation")
    assert values == {i: [i, "x" * i] for i in range(50)}
    assert all(r.status == wire.NOT_FOUND for r in replies.values()) and len(replies) == 5
    # the calls' replies; the requests' and the failure's left to the general path (and the
    # pair's first reply, whatever it was, if the peer's attach was still to check, LP-5)
    assert read.count(True) >= 49 and len(read) >= 55
