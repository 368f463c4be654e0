"""Every multiple-valued field of the spec (all of them symbols: capabilities, locales, outcomes,
SASL mechanisms) is read in each form a peer may send it: one value, an array, a list (what
Qpid Proton 0.37 sent for capabilities given as a Python list), each through the engine in a
hand-made frame. An item of another type, in whatever form, still closes the connection with
``amqp:decode-error``; what we send is always an array."""

from __future__ import annotations

import struct
from typing import Any

import proton
import pytest

from pairlink._amqp import errors, messaging, performatives
from pairlink._amqp.codec import decode, encode
from pairlink._amqp.config import ConnectionConfig
from pairlink._amqp.connection import Connection
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.events import (
    ConnectionOpened,
    Event,
    LinkAttachRequested,
    ProtocolViolation,
    SessionBegun,
    TransportFailed,
)
from pairlink._amqp.framing import AMQP_HEADER, FRAME_SASL, SASL_HEADER
from pairlink._amqp.messaging import Source, Target
from pairlink._amqp.performatives import (
    ROLE_SENDER,
    Attach,
    Begin,
    Open,
    SaslInit,
    SaslMechanisms,
)
from pairlink._amqp.sasl import ANONYMOUS, SaslClient, SaslServer
from pairlink._amqp.types import Array, Symbol
from tests.amqp.engine_peer import begun, composite, frame, frames, of, opened_pair, violation

S = Symbol
TWO = [S(ANONYMOUS), S("x")]
"""The values sent (ANONYMOUS first, so a SASL client finds its mechanism in any form)."""


def _list32(items: list[Any]) -> bytes:
    body = b"".join(encode(i) for i in items)
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(items)) + body


FORMS: dict[str, tuple[bytes, list[Symbol]]] = {
    "single": (encode(S(ANONYMOUS)), [S(ANONYMOUS)]),
    "array": (encode(Array(TWO)), TWO),
    "list8": (encode(TWO), TWO),
    "list32": (_list32(TWO), TWO),
}
WRONG: dict[str, bytes] = {
    "list-with-a-string": encode([S(ANONYMOUS), "x"]),
    "list-with-a-null": encode([S(ANONYMOUS), None]),
    "list-of-lists": encode([TWO]),
    "array-of-strings": encode(Array([ANONYMOUS, "x"])),
    "single-string": encode(ANONYMOUS),
}

ATTACH = Attach(
    name="l",
    handle=0,
    role=ROLE_SENDER,
    source=Source(address="a"),
    target=Target(address="b"),
    initial_delivery_count=0,
)
MINIMAL: dict[type, Any] = {
    Open: Open(container_id="peer"),
    Begin: Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10),
    Attach: ATTACH,
    Source: Source(address="a"),
    Target: Target(address="b"),
    SaslMechanisms: SaslMechanisms(sasl_server_mechanisms=[S(ANONYMOUS)]),
}
"""A valid instance of each class that has multiple fields, the frame they are changed in."""

MULTIPLE = [
    (cls, name)
    for module in (performatives, messaging)
    for cls in vars(module).values()
    if isinstance(cls, type) and cls.__module__ == module.__name__
    for name, spec in getattr(cls, "__amqp_fields__", ())
    if spec.multiple
]


def test_these_are_all_the_multiple_fields_of_the_spec() -> None:
    """(test_performatives checks each field's ``multiple`` against the spec's XML.)"""
    assert {(cls.__name__, name) for cls, name in MULTIPLE} == {
        ("Open", "outgoing_locales"), ("Open", "incoming_locales"),
        ("Open", "offered_capabilities"), ("Open", "desired_capabilities"),
        ("Begin", "offered_capabilities"), ("Begin", "desired_capabilities"),
        ("Attach", "offered_capabilities"), ("Attach", "desired_capabilities"),
        ("Source", "outcomes"), ("Source", "capabilities"), ("Target", "capabilities"),
        ("SaslMechanisms", "sasl_server_mechanisms"),
    }  # fmt: skip
    assert set(MINIMAL) == {cls for cls, _ in MULTIPLE}


def wire_of(value: Any, **raw: bytes) -> bytes:
    """``value`` as a described list32, the fields named in ``raw`` replaced by those bytes."""
    names = [name for name, _ in type(value).__amqp_fields__]
    encoded = encode(value)
    assert encoded[:2] == b"\x00\x53"  # a small descriptor code: the list follows its 3 bytes
    fields = decode(encoded[3:])
    fields += [None] * (len(names) - len(fields))
    return composite(
        encoded[2], *(raw.get(n) or encode(v) for n, v in zip(names, fields, strict=True))
    )


def deliver(cls: type, name: str, field: bytes) -> tuple[list[Event], list[Any], Any]:
    """Feed an engine the frame of ``cls`` whose field ``name`` is ``field``: its events, the
    frames it answered with, and the field as the engine's user sees it (None for a begin,
    whose fields the engine does not keep; for SASL, the mechanism the client chose)."""
    if cls is SaslMechanisms:
        client = Connection(ConnectionConfig("c", sasl=SaslClient.anonymous()), initiator=True)
        client.open()
        assert client.data_to_send() == SASL_HEADER
        wire = wire_of(MINIMAL[cls], **{name: field})
        events = client.receive_data(SASL_HEADER + frame(0, wire, FRAME_SASL))
        out = frames(client.data_to_send())
        chosen = [str(f.mechanism) for f in out if isinstance(f, SaslInit)]
        return events, out, chosen
    if cls is Open:
        server = Connection(ConnectionConfig("s"), initiator=False)
        wire = wire_of(MINIMAL[cls], **{name: field})
        events = server.receive_data(AMQP_HEADER + frame(0, wire))
        out = frames(server.data_to_send(), headers=1)
        opened = of(events, ConnectionOpened)
        return events, out, getattr(opened[0].open, name) if opened else None
    _, server = opened_pair()
    if cls is Begin:
        events = server.receive_data(frame(0, wire_of(MINIMAL[cls], **{name: field})))
        return events, frames(server.data_to_send()), None
    begun(server)
    if cls is Attach:
        wire = wire_of(ATTACH, **{name: field})
    else:  # a terminus, in a sender's attach
        terminus = wire_of(MINIMAL[cls], **{name: field})
        wire = wire_of(ATTACH, **{"source" if cls is Source else "target": terminus})
    events = server.receive_data(frame(0, wire))
    out = frames(server.data_to_send())
    requests = of(events, LinkAttachRequested)
    if not requests:
        return events, out, None
    attach = requests[0].link.remote_attach
    where = attach if cls is Attach else attach.source if cls is Source else attach.target
    return events, out, getattr(where, name)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("cls", "name"), MULTIPLE, ids=[f"{c.__name__}.{n}" for c, n in MULTIPLE])
def test_one_value_an_array_and_a_list_are_read(cls: type, name: str, form: str) -> None:
    field, expected = FORMS[form]
    events, out, seen = deliver(cls, name, field)
    assert not of(events, ProtocolViolation) and not of(events, TransportFailed)
    if cls is SaslMechanisms:
        assert seen == [ANONYMOUS]  # found in every form: the client answered with sasl-init
    elif cls is Begin:
        assert of(events, SessionBegun) and isinstance(out[0], Begin)
    else:
        assert seen == expected
        assert all(type(v) is Symbol for v in seen)


@pytest.mark.parametrize("wrong", WRONG)
@pytest.mark.parametrize(("cls", "name"), MULTIPLE, ids=[f"{c.__name__}.{n}" for c, n in MULTIPLE])
def test_an_item_of_another_type_is_a_decode_error(cls: type, name: str, wrong: str) -> None:
    events, out, _ = deliver(cls, name, WRONG[wrong])
    if cls is SaslMechanisms:  # before the AMQP header no close can be said: a hang-up
        (pv,) = of(events, ProtocolViolation)
        assert pv.condition == errors.DECODE_ERROR and not out
    else:
        assert violation(events, out) == errors.DECODE_ERROR
    assert not of(events, LinkAttachRequested)


@pytest.mark.parametrize("form", [*FORMS, "empty-list"])
@pytest.mark.parametrize(("cls", "name"), MULTIPLE, ids=[f"{c.__name__}.{n}" for c, n in MULTIPLE])
def test_what_was_read_as_a_list_is_sent_as_an_array(cls: type, name: str, form: str) -> None:
    field, expected = FORMS.get(form, (encode([]), []))
    value = decode(wire_of(MINIMAL[cls], **{name: field}))
    assert getattr(value, name) == expected
    again = encode(value)
    assert encode(Array(expected) if expected else Array([], 0xA3)) in again
    assert decode(again) == value


def test_a_list_is_bounded_like_any_other() -> None:
    many = _list32([S("c")] * 1000)
    with pytest.raises(DecodeError, match="more than 100 values"):
        decode(wire_of(MINIMAL[Open], offered_capabilities=many), max_elements=100)


def test_what_qpid_proton_writes_for_a_python_list_is_read() -> None:
    """Qpid Proton (0.40 here) writes terminus capabilities given as a Python list as an AMQP
    list (0.37 did so for the connection's too; 0.40 makes those an array): a real peer's
    bytes, to a server engine that also takes Proton's plain header (no SASL layer)."""
    conn = proton.Connection()
    conn.container = "proton"
    conn.desired_capabilities = [proton.symbol("a"), "b"]  # SymbolList: an array in 0.40
    transport = proton.Transport()
    transport.bind(conn)
    conn.open()
    session = conn.session()
    session.open()
    sender = session.sender("caps")
    sender.target.address = "echo"
    sender.target.capabilities.put_object([proton.symbol("queue"), proton.symbol("shared")])
    sender.source.capabilities.put_object(proton.symbol("one"))
    sender.open()
    wire = transport.peek(transport.pending()) or b""
    assert wire.startswith(AMQP_HEADER)
    assert _list32([S("queue"), S("shared")]) in wire  # a list, where the spec has an array

    server = Connection(ConnectionConfig("s", sasl=SaslServer()), initiator=False)
    events = server.receive_data(wire)
    assert not of(events, ProtocolViolation)
    (opened,) = of(events, ConnectionOpened)
    assert opened.open.desired_capabilities == [S("a"), S("b")]
    (requested,) = of(events, LinkAttachRequested)
    attach = requested.link.remote_attach
    assert attach.target.capabilities == [S("queue"), S("shared")]
    assert attach.source.capabilities == [S("one")]
