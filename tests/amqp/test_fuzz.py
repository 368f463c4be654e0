"""Fuzzing the engine: generated and mutated input never raises, never hangs, never reaches the
engine's internal-error backstop, and every breach ends in a close that carries an error
condition, with nothing written after it. The engine under test behaves like a service: it
answers every attach, grants credit, settles what it receives, answers drains and sends on the
links the peer lets it, so credit, reassembly, settlement and sending are fuzzed too."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairlink._amqp import errors
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import (
    Event,
    LinkAttachRequested,
    LinkFlow,
    MessageReceived,
    ProtocolViolation,
    TransportFailed,
)
from pairlink._amqp.framing import AMQP_HEADER, encode_frame
from pairlink._amqp.link import LinkState
from pairlink._amqp.messaging import (
    Accepted,
    Error,
    Message,
    Modified,
    Received,
    Rejected,
    Released,
    Source,
    Target,
)
from pairlink._amqp.performatives import (
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
from pairlink._amqp.testing import engine_pair, pump
from pairlink._amqp.types import Symbol
from tests.amqp.engine_peer import frames

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REPLY = Message(body="reply").encode()


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
    client.send(sender, Message(body="x" * 3000).encode(), presume_credit=True)  # 6 frames
    client.detach(sender)
    client.end(session)
    client.close()
    burst = client.data_to_send()
    assert server is not None
    return burst[len(AMQP_HEADER) :]


BURST = recorded_client_burst()


def fresh_server() -> Connection:
    server = Connection(
        ConnectionConfig("fuzzed", max_frame_size=4096, max_unsettled=4, max_incomplete_bytes=6000),
        initiator=False,
    )
    server.receive_data(AMQP_HEADER)
    server.data_to_send()
    return server


def serve(server: Connection, events: list[Event], sent: list[int]) -> None:
    """What a service does with the engine's events: answer, grant, settle, drain, reply."""
    for event in events:
        if isinstance(event, LinkAttachRequested):
            link = event.link
            remote = link.remote_attach
            assert remote is not None
            server.answer_attach(  # the peer's own termini and fields go back: they must encode
                link,
                source=link.remote_source,
                target=link.remote_target,
                properties=link.remote_properties,
                offered_capabilities=remote.desired_capabilities,
            )
            if link.is_receiver:
                server.flow(link, 4)  # what the recorded client pipelines; fuzz may want more
        elif isinstance(event, MessageReceived):
            link = event.link
            if not event.delivery.remote_settled:
                server.settle(event.delivery, Accepted())
            if link.link_credit < 2 and link.state is LinkState.ATTACHED:  # (still, in this
                server.flow(link, 3)  # batch of events: a later frame may have detached it)
        elif isinstance(event, LinkFlow) and event.link.is_sender:
            link = event.link
            if not link.send_blocked and sent[0] < 4 and link.state is LinkState.ATTACHED:
                server.send(link, REPLY)
                sent[0] += 1
            if link.drain:
                server.complete_drain(link)


def feed_and_check(server: Connection, data: bytes, step: int | None = None) -> list[Event]:
    """Feed ``data`` serving every event; assert the no-raise and close-on-error rules."""
    events: list[Event] = []
    out = bytearray()
    sent = [0]
    step = step or max(1, len(data))
    for i in range(0, len(data), step):
        new = server.receive_data(data[i : i + step], now=float(i))
        while True:
            events += new
            serve(server, new, sent)
            if not server.input_paused:
                break
            new = server.resume_input()
        server.tick(float(i))
        out += server.data_to_send()
    internal = [e for e in events if isinstance(e, ProtocolViolation) and e.cause is not None]
    assert not internal, f"the engine failed on its own: {internal[0].cause!r}"
    written = frames(bytes(out))
    closes = [i for i, f in enumerate(written) if isinstance(f, Close)]
    assert len(closes) <= 1 and (not closes or closes[0] == len(written) - 1), "after close"
    violations = [e for e in events if isinstance(e, ProtocolViolation)]
    if violations:
        assert server.transport_done
        assert closes, "a violation must be answered with a close"
        close = written[closes[0]]
        assert close.error is not None
        assert close.error.condition == violations[0].condition
        assert str(violations[0].condition).startswith("amqp:")
        assert violations[0].condition != errors.INTERNAL_ERROR
    return events


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
_credit = st.sampled_from([0, 1, 3, 2**31 - 1, 2**31, 2**32 - 1]) | _uint
_small = st.integers(0, 8)
_symbols = st.lists(st.sampled_from([Symbol("LINK_PAIR_V1_0"), Symbol("x")]), max_size=2)
_states = st.sampled_from(
    [None, Accepted(), Released(), Rejected(error=Error("amqp:x")), Modified(), Received(0, 0)]
)

_opens = st.builds(
    Open,
    container_id=st.text(max_size=8),
    max_frame_size=st.sampled_from([512, 4096]) | _uint,
    channel_max=st.integers(0, 3) | st.integers(0, 65535),
    idle_time_out=st.none() | _uint,
)
_performatives = st.one_of(
    _opens,
    st.builds(
        Begin,
        remote_channel=st.none() | _small,
        next_outgoing_id=_uint,
        incoming_window=st.sampled_from([0, 1, 2**31, 2**32 - 1]) | _uint,
        outgoing_window=_uint,
        handle_max=st.integers(0, 3) | _uint,
    ),
    st.builds(
        Attach,
        name=st.sampled_from(["a", "b"]),
        handle=_small,
        role=st.booleans(),
        snd_settle_mode=st.integers(0, 2),
        rcv_settle_mode=st.integers(0, 1),
        source=st.none() | st.builds(Source, address=st.sampled_from(["s", "", "$me"])),
        target=st.none() | st.builds(Target, address=st.sampled_from(["t", "$me"])),
        initial_delivery_count=st.none() | _uint,
        max_message_size=st.none() | _uint,
        desired_capabilities=st.none() | _symbols,
        properties=st.none() | st.just({Symbol("paired"): True}),
    ),
    st.builds(
        Flow,
        next_incoming_id=st.none() | _uint,
        incoming_window=_credit,
        next_outgoing_id=_uint,
        outgoing_window=_uint,
        handle=st.none() | _small,
        delivery_count=st.none() | _uint,
        link_credit=st.none() | _credit,
        drain=st.booleans(),
        echo=st.booleans(),
    ),
    st.builds(
        Transfer,
        handle=_small,
        delivery_id=st.none() | st.integers(0, 8) | _uint,
        delivery_tag=st.none() | st.binary(max_size=4),
        settled=st.none() | st.booleans(),
        more=st.booleans(),
        state=_states,
        aborted=st.booleans(),
    ),
    st.builds(
        Disposition,
        role=st.booleans(),
        first=st.integers(0, 8) | _uint,
        last=st.none() | st.integers(0, 8) | _uint,
        settled=st.booleans(),
        state=_states,
    ),
    st.builds(Detach, handle=_small, closed=st.booleans()),
    st.builds(End),
    st.builds(Close),
)
_payloads = st.sampled_from([b"", REPLY, REPLY[:5], b"x" * 3000]) | st.binary(max_size=20)
Frames = list[tuple[int, Any, bytes]]


@st.composite
def _valid_prefix(draw: st.DrawFn) -> Frames:
    """What a legal peer could say after its open: sessions, links both ways, credit for ours,
    deliveries (some of several frames) on its own, and dispositions for what we sent."""
    out: Frames = []
    for channel in range(draw(st.integers(1, 3))):
        window = draw(st.sampled_from([1, 3, 2**31, 2**32 - 1]))
        handle_max = draw(st.integers(0, 2) | st.just(2**32 - 1))
        out.append((channel, Begin(next_outgoing_id=0, incoming_window=window,
                                   outgoing_window=9, handle_max=handle_max), b""))  # fmt: skip
        delivery_id = 0
        for handle in range(draw(st.integers(0, 3))):
            sender = draw(st.booleans())  # the peer's role
            out.append((channel, Attach(
                name=f"l{handle}", handle=handle, role=sender is False,
                source=Source(address="s"), target=Target(address="t"),
                initial_delivery_count=0 if sender else None,
            ), b""))  # fmt: skip
            if not sender:  # credit for our sender (the engine then sends, and is drained)
                credit = draw(_credit)
                out.append((channel, Flow(next_incoming_id=0, incoming_window=9,
                                          next_outgoing_id=0, outgoing_window=9, handle=handle,
                                          delivery_count=0, link_credit=credit,
                                          drain=draw(st.booleans())), b""))  # fmt: skip
                out.append((channel, Disposition(role=ROLE_RECEIVER, first=0, settled=True,
                                                 state=draw(_states)), b""))  # fmt: skip
                continue
            for _ in range(draw(st.integers(0, 3))):
                parts = draw(st.integers(1, 3))
                tag = b"%d" % delivery_id
                settled = draw(st.booleans())
                for part in range(parts):
                    first = part == 0
                    out.append((channel, Transfer(
                        handle=handle, delivery_id=delivery_id if first else None,
                        delivery_tag=tag if first else None, settled=settled,
                        more=part < parts - 1,
                    ), REPLY))  # fmt: skip
                delivery_id += 1
    return out


_sequences = st.tuples(
    _opens, _valid_prefix(), st.lists(st.tuples(_small, _performatives, _payloads), max_size=8)
)


def _encoded(sequence: tuple[Open, Frames, Frames]) -> bytes:
    first, prefix, frame_list = sequence
    out = bytearray()
    encode_frame(out, 0, first)
    for channel, performative, payload in prefix + frame_list:
        encode_frame(out, channel, performative, payload)
    return bytes(out)


@FUZZ
@given(_sequences)
def test_generated_frame_sequences(sequence: tuple[Open, Frames, Frames]) -> None:
    events = feed_and_check(fresh_server(), _encoded(sequence))
    assert not any(isinstance(e, TransportFailed) for e in events)


@FUZZ
@given(
    _sequences,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.sampled_from([None, 3]),
)
def test_generated_then_mutated_frame_sequences(
    sequence: tuple[Open, Frames, Frames],
    mutations: list[tuple[int, int]],
    step: int | None,
) -> None:
    data = bytearray(_encoded(sequence))
    for offset, value in mutations:
        data[offset % len(data)] = value
    feed_and_check(fresh_server(), bytes(data), step)


def test_a_well_behaved_client_causes_no_violation() -> None:
    """The control: the unmutated recording is legal, so the fuzz tests' checks can fail; the
    server answers both attaches, takes every message (one of six frames) and settles it."""
    server = fresh_server()
    events = feed_and_check(server, BURST)
    assert not [e for e in events if isinstance(e, ProtocolViolation)]
    assert len([e for e in events if isinstance(e, LinkAttachRequested)]) == 2
    received = [e for e in events if isinstance(e, MessageReceived)]
    assert [Message.decode(e.payload).body for e in received] == ["m0", "m1", "m2", "x" * 3000]


def test_engines_stay_quiet_after_a_clean_exchange() -> None:
    client, server = engine_pair()
    client.open()
    pump(client, server)
    client.close()
    pump(client, server)
    assert client.transport_done and server.transport_done
