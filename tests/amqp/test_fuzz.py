"""Fuzzing the engine: generated and mutated input never raises, never hangs, and every
breach ends in a close that carries an error condition."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework.amqp.connection import Connection, ConnectionConfig
from framework.amqp.events import Event, ProtocolViolation, TransportFailed
from framework.amqp.framing import AMQP_HEADER, FrameReader, encode_frame
from framework.amqp.messaging import Message, Source, Target
from framework.amqp.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    Transfer,
)
from framework.testing import engine_pair, pump

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def recorded_client_burst() -> bytes:
    """What a real client says: open, begin, attaches, flow, transfers, disposition, detach..."""
    client, server = engine_pair()
    client.open()
    session = client.begin()
    receiver = client.attach(
        session,
        name="p",
        role=ROLE_RECEIVER,
        source=Source(address="s"),
        target=Target(address="c"),
    )
    client.flow(receiver, 10)
    sender = client.attach(
        session, name="p", role=ROLE_SENDER, source=Source(address="c"), target=Target(address="s")
    )
    for i in range(3):
        client.send(sender, Message(body=f"m{i}").encode(), presume_credit=True)
    client.detach(sender)
    client.end(session)
    client.close()
    burst = client.data_to_send()
    assert server is not None
    return burst[len(AMQP_HEADER) :]


BURST = recorded_client_burst()


def fresh_server() -> Connection:
    server = Connection(ConnectionConfig("fuzzed", max_frame_size=4096), initiator=False)
    server.receive_data(AMQP_HEADER)
    server.data_to_send()
    return server


def feed_and_check(server: Connection, data: bytes, step: int | None = None) -> list[Event]:
    """Feed ``data`` answering every attach; assert the no-raise and close-on-error rules."""
    events: list[Event] = []
    step = step or max(1, len(data))
    for i in range(0, len(data), step):
        new = server.receive_data(data[i : i + step])
        while True:
            events += new
            if not server.input_paused:
                break
            new = server.receive_data(b"")
        server.tick(float(i))
    out = server.data_to_send()
    violations = [e for e in events if isinstance(e, ProtocolViolation)]
    if violations:
        assert server.transport_done
        closes = [f for f in _frames(out) if isinstance(f, Close)]
        assert closes, "a violation must be answered with a close"
        assert closes[-1].error is not None
        assert closes[-1].error.condition == violations[0].condition
        assert str(violations[0].condition).startswith("amqp:")
    return events


def _frames(out: bytes) -> list[Any]:
    if out.startswith(AMQP_HEADER):
        out = out[len(AMQP_HEADER) :]
    reader = FrameReader()
    reader.feed(out)
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame.performative)
    return frames


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_after_the_header(data: bytes) -> None:
    feed_and_check(fresh_server(), data)


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(BURST) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    st.sampled_from([None, 1, 7]),
)
def test_mutated_real_session(mutations: list[tuple[int, int]], step: int | None) -> None:
    data = bytearray(BURST)
    for offset, value in mutations:
        data[offset] = value
    feed_and_check(fresh_server(), bytes(data), step)


@FUZZ
@given(st.integers(0, len(BURST)), st.binary(max_size=40))
def test_truncated_or_spliced_real_session(cut: int, junk: bytes) -> None:
    feed_and_check(fresh_server(), BURST[:cut] + junk + BURST[cut:])


_uint = st.integers(0, 2**32 - 1)
_small = st.integers(0, 8)
_field_values = st.one_of(
    st.none(), _uint, st.booleans(), st.text(max_size=4), st.binary(max_size=4)
)

_performatives = st.one_of(
    st.builds(
        Open,
        container_id=st.text(max_size=8),
        max_frame_size=_uint,
        channel_max=st.integers(0, 65535),
        idle_time_out=st.none() | _uint,
    ),
    st.builds(
        Begin,
        remote_channel=st.none() | _small,
        next_outgoing_id=_uint,
        incoming_window=_uint,
        outgoing_window=_uint,
        handle_max=_uint,
    ),
    st.builds(
        Attach,
        name=st.sampled_from(["a", "b"]),
        handle=_small,
        role=st.booleans(),
        snd_settle_mode=st.integers(0, 2),
        rcv_settle_mode=st.integers(0, 1),
        initial_delivery_count=st.none() | _uint,
        max_message_size=st.none() | _uint,
    ),
    st.builds(
        Flow,
        next_incoming_id=st.none() | _uint,
        incoming_window=_uint,
        next_outgoing_id=_uint,
        outgoing_window=_uint,
        handle=st.none() | _small,
        delivery_count=st.none() | _uint,
        link_credit=st.none() | _uint,
        drain=st.booleans(),
        echo=st.booleans(),
    ),
    st.builds(
        Transfer,
        handle=_small,
        delivery_id=st.none() | _uint,
        delivery_tag=st.none() | st.binary(max_size=4),
        settled=st.none() | st.booleans(),
        more=st.booleans(),
        aborted=st.booleans(),
    ),
    st.builds(
        Disposition, role=st.booleans(), first=_uint, last=st.none() | _uint, settled=st.booleans()
    ),
    st.builds(Detach, handle=_small, closed=st.booleans()),
    st.builds(End),
    st.builds(Close),
)


@FUZZ
@given(st.lists(st.tuples(_small, _performatives, st.binary(max_size=20)), max_size=12))
def test_generated_frame_sequences(frames: list[tuple[int, Any, bytes]]) -> None:
    out = bytearray()
    encode_frame(out, 0, Open(container_id="fuzzer"))
    for channel, performative, payload in frames:
        encode_frame(out, channel, performative, payload)
    events = feed_and_check(fresh_server(), bytes(out))
    assert not any(isinstance(e, TransportFailed) for e in events)


def test_a_well_behaved_client_causes_no_violation() -> None:
    """The control: the unmutated recording is legal, so the fuzz tests' checks can fail."""
    server = fresh_server()
    events = feed_and_check(server, BURST)
    assert not [e for e in events if isinstance(e, ProtocolViolation)]


def test_engines_stay_quiet_after_a_clean_exchange() -> None:
    client, server = engine_pair()
    client.open()
    pump(client, server)
    client.close()
    pump(client, server)
    assert client.transport_done and server.transport_done
