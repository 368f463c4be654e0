"""What the engine tests share: feeding a ``Connection`` hand-made frames, reading the frames it
answers with, and pairs of engines already opened or linked."""

from __future__ import annotations

import struct
from typing import Any

from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import Event, LinkAttachRequested, ProtocolViolation
from pairlink._amqp.framing import FRAME_AMQP, FrameReader, encode_frame
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Source, Target
from pairlink._amqp.performatives import ROLE_SENDER, Attach, Begin, Close
from pairlink._amqp.testing import engine_pair, pump


def of(events: list[Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def frames(data: bytes, headers: int = 0) -> list[Any]:
    """Performatives in ``data`` (after ``headers`` protocol headers); None for heartbeats."""
    reader = FrameReader()
    reader.feed(data)
    for _ in range(headers):
        assert reader.read_protocol_header() is not None
    out = []
    while (frame := reader.read_frame()) is not None:
        out.append(frame.performative)
    assert reader.buffered == 0
    return out


def opened_pair(**server_cfg: Any) -> tuple[Connection, Connection]:
    client, server = engine_pair(
        ConnectionConfig("client"), ConnectionConfig("server", **server_cfg)
    )
    client.open()
    server.open()
    pump(client, server)
    return client, server


def linked(
    client: Connection, server: Connection, *, credit: int = 10, **attach: Any
) -> tuple[Link, Link]:
    """A client sender attached to a server receiver holding ``credit``."""
    session = client.begin()
    sender = client.attach(
        session,
        name="l1",
        role=ROLE_SENDER,
        source=Source(address="a"),
        target=Target(address="q"),
        **attach,
    )
    _, ev = pump(client, server)
    (req,) = of(ev, LinkAttachRequested)
    receiver = req.link
    server.answer_attach(receiver, source=receiver.remote_source, target=receiver.remote_target)
    server.flow(receiver, credit)
    pump(client, server)
    assert sender.link_credit == credit
    return sender, receiver


def composite(code: int, *fields: bytes) -> bytes:
    """A described list ``0x00 0x53 code`` of already encoded fields, so any bytes can go in."""
    body = b"".join(fields)
    return (
        b"\x00\x53"
        + bytes([code])
        + b"\xd0"
        + struct.pack(">II", len(body) + 4, len(fields))
        + body
    )


def frame(channel: int, body: bytes, frame_type: int = FRAME_AMQP) -> bytes:
    """A frame around ``body``, hand-made bytes that need not be a performative we encode."""
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


def server_frames_after(server: Connection, inject: bytes) -> tuple[list[Event], list[Any]]:
    events = server.receive_data(inject)
    return events, frames(server.data_to_send())


def violation(events: list[Event], out: list[Any]) -> str:
    """The condition of the close the engine answered with (and checks it is one)."""
    (pv,) = of(events, ProtocolViolation)
    closes = [f for f in out if isinstance(f, Close)]
    assert closes and closes[-1].error is not None
    assert closes[-1].error.condition == pv.condition
    return str(pv.condition)


def raw(channel: int, performative: Any, payload: bytes = b"") -> bytes:
    out = bytearray()
    encode_frame(out, channel, performative, payload)
    return bytes(out)


def begun(server: Connection) -> None:
    server.receive_data(raw(0, Begin(next_outgoing_id=0, incoming_window=2, outgoing_window=9)))
    server.data_to_send()


def attach_sender(server: Connection, handle: int = 0, name: str = "l") -> Link:
    events = server.receive_data(
        raw(
            0,
            Attach(
                name=name,
                handle=handle,
                role=ROLE_SENDER,
                source=Source(address="a"),
                target=Target(address="b"),
                initial_delivery_count=0,
            ),
        )
    )
    (req,) = of(events, LinkAttachRequested)
    return req.link  # type: ignore[no-any-return]
