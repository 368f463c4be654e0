"""The engine's pass-through for relays (``Connection.pass_through`` and ``Connection.forward``)
against its general path: the same input leaves the same state (windows, ids, credit), the same
output bytes, and no message overtakes another of its link."""

from __future__ import annotations

import random
from typing import Any

from pairlink._amqp import errors
from pairlink._amqp.connection import Connection
from pairlink._amqp.events import MessageReceived, ProtocolViolation
from pairlink._amqp.link import Link
from pairlink._amqp.performatives import SND_SETTLED
from tests.amqp.engine_peer import frame, linked, of, opened_pair


class Forwarder:
    """A ``Link.forward`` that takes every payload but those in ``decline``."""

    def __init__(self, decline: tuple[bytes, ...] = ()) -> None:
        self.decline = decline
        self.payloads: list[bytes] = []

    def __call__(self, payload: bytearray) -> bool:
        if bytes(payload) in self.decline:
            return False
        self.payloads.append(bytes(payload))
        return True


def twins(credit: int = 50) -> list[tuple[Connection, Connection, Link, Link]]:
    """Two identical client-sender / server-receiver pairs."""
    out = []
    for _ in range(2):
        client, server = opened_pair()
        sender, receiver = linked(client, server, credit=credit, snd_settle_mode=SND_SETTLED)
        out.append((client, server, sender, receiver))
    return out


def state(receiver: Link) -> tuple[Any, ...]:
    session: Any = receiver.session
    return (
        receiver.link_credit,
        receiver.delivery_count,
        receiver.unsettled,
        session.incoming_window,
        session.next_incoming_id,
        session.next_incoming_delivery,
    )


def sent(client: Connection, sender: Link, payloads: list[bytes], **send: Any) -> bytes:
    for payload in payloads:
        client.send(sender, payload, **send)
    return client.data_to_send()


def test_passed_through_messages_count_as_the_general_path_counts_them() -> None:
    (c1, s1, snd1, rcv1), (c2, s2, snd2, rcv2) = twins()
    forward = Forwarder()
    s1.pass_through(rcv1, forward)
    payloads = [bytes([i]) * (i * 7) for i in range(20)]
    data = sent(c1, snd1, payloads)
    assert data == sent(c2, snd2, payloads)
    assert of(s1.receive_data(data), MessageReceived) == []
    general = of(s2.receive_data(data), MessageReceived)
    assert forward.payloads == [m.payload for m in general] == payloads
    assert state(rcv1) == state(rcv2)
    assert s1.data_to_send() == s2.data_to_send()  # the same flows (window refills), if any


def test_forward_writes_the_frames_send_writes() -> None:
    (c1, _, snd1, _), (c2, _, snd2, _) = twins()
    payloads = [b"x" * n for n in (0, 1, 64, 300, 4000)]
    for payload in payloads:
        assert c1.forward(snd1, payload)
        c2.send(snd2, payload, settled=True)
    assert c1.data_to_send() == c2.data_to_send()
    assert (snd1.link_credit, snd1.delivery_count) == (snd2.link_credit, snd2.delivery_count)
    c1.send(snd1, b"after")  # what follows forward goes on with the same ids and tags
    c2.send(snd2, b"after")
    assert c1.data_to_send() == c2.data_to_send()


def test_forward_declines_what_send_would_not_write_at_once() -> None:
    client, server = opened_pair()
    sender, _ = linked(client, server, credit=1, snd_settle_mode=SND_SETTLED)
    assert not client.forward(sender, b"x" * 70_000)  # more than one frame: send splits it
    assert client.forward(sender, b"one")
    assert not client.forward(sender, b"two")  # no credit left
    assert sender.link_credit == 0


def test_a_message_never_overtakes_an_earlier_one_of_its_link() -> None:
    """A message reported as an event (here: unsettled, or declined) holds every later one of
    its link in the same input to the general path, in order."""
    client, server = opened_pair()
    sender, receiver = linked(client, server, credit=20)
    forward = Forwarder(decline=(b"declined",))
    server.pass_through(receiver, forward)
    client.send(sender, b"first", settled=True)
    client.send(sender, b"unsettled", settled=False)
    client.send(sender, b"after", settled=True)
    events = of(server.receive_data(client.data_to_send()), MessageReceived)
    assert forward.payloads == [b"first"]
    assert [e.payload for e in events] == [b"unsettled", b"after"]

    client.send(sender, b"next input", settled=True)  # a new input: passes through again
    assert of(server.receive_data(client.data_to_send()), MessageReceived) == []
    assert forward.payloads == [b"first", b"next input"]

    client.send(sender, b"declined", settled=True)  # arrives as usual, as the rest behind it
    client.send(sender, b"behind it", settled=True)
    events = of(server.receive_data(client.data_to_send()), MessageReceived)
    assert [e.payload for e in events] == [b"declined", b"behind it"]


def test_a_multi_frame_message_is_not_passed_through() -> None:
    client, server = opened_pair(max_frame_size=512)
    sender, receiver = linked(client, server, credit=20, snd_settle_mode=SND_SETTLED)
    forward = Forwarder()
    server.pass_through(receiver, forward)
    big = bytes(range(256)) * 8
    client.send(sender, big)
    client.send(sender, b"small")
    events = of(server.receive_data(client.data_to_send()), MessageReceived)
    assert [e.payload for e in events] == [big, b"small"]
    assert forward.payloads == []


def test_damaged_input_meets_the_same_fate_passed_through_or_not() -> None:
    """Bytes of a stream of passable messages damaged at random (seeded): the engine that
    passes messages through and the one that does not take the same messages, in the same
    order, answer with the same bytes and end in the same state."""
    rng = random.Random(13)
    for _ in range(300):
        (c1, s1, snd1, rcv1), (c2, s2, snd2, rcv2) = twins()
        payloads = [bytes([i]) * rng.randrange(0, 40) for i in range(6)]
        data = bytearray(sent(c1, snd1, payloads))
        sent(c2, snd2, payloads)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        forward = Forwarder()
        s1.pass_through(rcv1, forward)
        events1 = s1.receive_data(bytes(data))
        events2 = s2.receive_data(bytes(data))
        taken = forward.payloads + [e.payload for e in of(events1, MessageReceived)]
        assert taken == [e.payload for e in of(events2, MessageReceived)]
        assert [type(e) for e in events1 if not isinstance(e, MessageReceived)] == [
            type(e) for e in events2 if not isinstance(e, MessageReceived)
        ]
        assert [e.condition for e in of(events1, ProtocolViolation)] == [
            e.condition for e in of(events2, ProtocolViolation)
        ]
        assert s1.data_to_send() == s2.data_to_send()
        assert state(rcv1) == state(rcv2)


def test_a_tag_over_32_bytes_is_judged_by_the_general_path() -> None:
    (_, s1, _, rcv1), (_, s2, _, _) = twins()
    forward = Forwarder()
    s1.pass_through(rcv1, forward)
    fields = b"\x43\x43\xa0\x21" + b"t" * 33 + b"\x43\x41"  # handle 0, delivery-id 0, 33 bytes
    body = b"\x00\x53\x14\xc0" + bytes([len(fields) + 1, 5]) + fields + b"payload"
    for server in (s1, s2):
        (violation,) = of(server.receive_data(frame(0, body)), ProtocolViolation)
        assert violation.condition == errors.INVALID_FIELD
    assert forward.payloads == []
