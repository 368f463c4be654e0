"""The connection engine, sans-IO: bytes in, events and frames out (h11-style tests)."""

from __future__ import annotations

from typing import Any

import pytest

from pairlink._amqp import errors
from pairlink._amqp.codec import encode
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    ProtocolViolation,
    SaslDone,
    SessionBegun,
    SessionEnded,
    TransportFailed,
)
from pairlink._amqp.framing import AMQP_HEADER, HEARTBEAT, SASL_HEADER
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Accepted, Error, Message, Rejected, Source, Target
from pairlink._amqp.performatives import (
    RCV_SECOND,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_SETTLED,
    Attach,
    Begin,
    Detach,
    Flow,
    Open,
    Transfer,
)
from pairlink._amqp.sasl import SaslClient, SaslServer
from pairlink._amqp.session import TRANSFER_BOUND
from pairlink._amqp.testing import engine_pair, pump, sasl_engine_pair
from tests.amqp.engine_peer import (
    attach_sender,
    begun,
    frames,
    linked,
    of,
    opened_pair,
    raw,
    server_frames_after,
    violation,
)

# -- the happy paths -------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 1])
def test_pipelined_open_begin_attach_flow_transfer_one_burst(chunk: int | None) -> None:
    client, server = engine_pair()
    client.open()
    session = client.begin()
    receiver = client.attach(
        session,
        name="pair",
        role=ROLE_RECEIVER,
        source=Source(address="svc"),
        target=Target(address="me"),
    )
    client.flow(receiver, 5)
    sender = client.attach(
        session,
        name="pair",
        role=ROLE_SENDER,
        source=Source(address="me"),
        target=Target(address="svc"),
    )
    client.send(sender, Message(body="hi").encode(), presume_credit=True)
    burst = client.data_to_send()
    assert burst.startswith(AMQP_HEADER)
    kinds = [type(f) for f in frames(burst, headers=1)]
    assert kinds == [Open, Begin, Attach, Flow, Attach, Transfer]

    # the server answers each attach as it is read, granting credit before the transfer
    events: list[Event] = []
    step = chunk or len(burst)
    for i in range(0, len(burst), step):
        new = server.receive_data(burst[i : i + step])
        while True:
            events += new
            for req in of(new, LinkAttachRequested):
                link = req.link
                server.answer_attach(link, source=link.remote_source, target=link.remote_target)
                if link.is_receiver:
                    server.flow(link, 1)
            if not server.input_paused:
                break
            new = server.resume_input()
    assert [type(e) for e in events] == [
        ConnectionOpened,
        SessionBegun,
        LinkAttachRequested,
        LinkFlow,
        LinkAttachRequested,
        MessageReceived,
    ]
    (msg,) = of(events, MessageReceived)
    assert Message.decode(msg.payload).body == "hi"
    reply = server.data_to_send()
    assert [type(f) for f in frames(reply, headers=1)] == [Open, Begin, Attach, Attach, Flow]
    ev_c = client.receive_data(reply)
    assert len(of(ev_c, LinkAttached)) == 2
    assert sender.link_credit == 0  # the one credit granted was used by the pipelined transfer


def test_large_message_is_split_by_peer_max_frame_size_and_reassembled() -> None:
    client, server = opened_pair(max_frame_size=512)
    sender, _receiver = linked(client, server)
    payload = Message(body=b"x" * 100_000, body_kind="data").encode()
    client.send(sender, payload)
    data = client.data_to_send()
    transfers = frames(data)
    assert len(transfers) > 100
    assert all(t.more for t in transfers[:-1]) and not transfers[-1].more
    assert transfers[0].delivery_id == 0 and transfers[1].delivery_id is None
    events = server.receive_data(data)
    (msg,) = of(events, MessageReceived)
    assert msg.payload == payload


def test_no_first_transfer_outgrows_the_bound_that_skips_measuring_it() -> None:
    """Session.send puts a message in one frame unmeasured when it fits with TRANSFER_BOUND
    bytes (plus the tag) to spare: the widest first transfer must not need more."""
    tag = b"t" * 32  # the longest delivery-tag the spec allows
    widest = Transfer(
        handle=2**32 - 1,
        delivery_id=2**32 - 1,
        delivery_tag=tag,
        message_format=2**32 - 1,
        settled=True,
        more=True,
    )
    assert len(encode(widest)) <= TRANSFER_BOUND + len(tag)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_message_that_just_fits_the_frame_is_not_split(extra: int) -> None:
    client, server = opened_pair(max_frame_size=512)
    sender, _receiver = linked(client, server)
    client.send(sender, b"x")  # delivery-id 0 takes a byte less than those that follow
    client.data_to_send()
    client.send(sender, b"x")
    overhead = len(client.data_to_send()) - 1  # frame header and transfer, with a 1-byte tag
    size = 512 - overhead - 1 + extra  # the room is measured with `more` set (one byte)
    client.send(sender, b"y" * size)
    data = client.data_to_send()
    assert len(frames(data)) == 1 + extra
    assert [m.payload for m in of(server.receive_data(data), MessageReceived)] == [b"y" * size]


def test_dispositions_coalesce_into_ranges_and_reach_the_sender() -> None:
    client, server = opened_pair()
    sender, _receiver = linked(client, server, credit=10)
    deliveries = [client.send(sender, b"\x00Sw\xa1\x01x") for _ in range(6)]
    _, ev = pump(client, server)
    received = [m.delivery for m in of(ev, MessageReceived)]
    for d in received[:4]:
        server.settle(d, Accepted())
    server.settle(received[4], Rejected(error=Error(condition=errors.INVALID_FIELD)))
    server.settle(received[5], Accepted())
    out = frames(server.data_to_send())
    assert [(f.first, f.last, type(f.state)) for f in out] == [
        (0, 3, Accepted),
        (4, None, Rejected),
        (5, None, Accepted),
    ]
    events: list[Event] = []
    for f in out:
        events += client.receive_data(raw(0, f))
    updated = [e.delivery for e in of(events, DeliveryUpdated)]
    assert updated == deliveries
    assert all(d.remote_settled for d in deliveries)
    assert isinstance(deliveries[4].remote_state, Rejected)


def test_presettled_sends_need_no_disposition() -> None:
    client, server = opened_pair()
    sender, _ = linked(client, server, snd_settle_mode=SND_SETTLED)
    client.send(sender, b"\x00Sw\x40")
    (t,) = frames(client.data_to_send())
    assert t.settled is True
    assert not client.sessions[0].unsettled_out


def test_rcv_settle_mode_second_settles_after_the_sender() -> None:
    client, server = opened_pair()
    sender, receiver = linked(client, server, rcv_settle_mode=RCV_SECOND)
    assert receiver.rcv_settle_mode == RCV_SECOND
    delivery = client.send(sender, b"\x00Sw\x40")
    _, ev = pump(client, server)
    (msg,) = of(ev, MessageReceived)
    server.settle(msg.delivery, Accepted(), settled=False)  # first: the outcome, unsettled
    ev_c, _ = pump(client, server)
    (upd,) = of(ev_c, DeliveryUpdated)
    assert isinstance(upd.delivery.remote_state, Accepted) and not upd.delivery.remote_settled
    client.settle(delivery, Accepted())  # the sender settles ...
    _, ev_s = pump(client, server)
    (upd_s,) = of(ev_s, DeliveryUpdated)  # ... and the receiver learns it
    assert upd_s.delivery is msg.delivery and upd_s.delivery.remote_settled


def test_send_without_credit_is_refused_locally() -> None:
    client, server = opened_pair()
    sender, _ = linked(client, server, credit=1)
    client.send(sender, b"\x00Sw\x40")
    with pytest.raises(LocalProtocolError) as exc:
        client.send(sender, b"\x00Sw\x40")
    assert exc.value.condition == errors.TRANSFER_LIMIT_EXCEEDED


def test_drain_uses_up_credit_and_echo_is_answered() -> None:
    client, server = opened_pair()
    sender, receiver = linked(client, server, credit=7)
    server.flow(receiver, 7, drain=True)
    ev_c, _ = pump(client, server)
    assert of(ev_c, LinkFlow) and sender.drain
    client.complete_drain(sender)
    _, ev_s = pump(client, server)
    assert of(ev_s, LinkFlow)
    assert receiver.link_credit == 0 and receiver.delivery_count == 7
    server.flow(receiver, 3, echo=True)
    data = server.data_to_send()
    client.receive_data(data)
    (echo,) = frames(client.data_to_send())
    assert isinstance(echo, Flow) and echo.handle == sender.handle and echo.link_credit == 3


def test_detach_closed_and_not_closed_and_end_and_close() -> None:
    client, server = opened_pair()
    sender, _receiver = linked(client, server)
    client.detach(sender, closed=False)
    ev_c, ev_s = pump(client, server)
    (d_s,) = of(ev_s, LinkDetached)
    assert d_s.by_peer and d_s.closed is False
    (d_c,) = of(ev_c, LinkDetached)
    assert not d_c.by_peer
    client.end(client.sessions[0], Error(condition=errors.INTERNAL_ERROR, description="bye"))
    ev_c, ev_s = pump(client, server)
    (end_s,) = of(ev_s, SessionEnded)
    assert end_s.error.condition == errors.INTERNAL_ERROR and end_s.by_peer
    assert of(ev_c, SessionEnded)
    server.close(Error(condition=errors.CONNECTION_FORCED, description="maintenance"))
    ev_c, ev_s = pump(client, server)
    (closed,) = of(ev_c, ConnectionClosed)
    assert closed.by_peer and closed.error.condition == errors.CONNECTION_FORCED
    assert of(ev_s, ConnectionClosed) and client.transport_done and server.transport_done


def test_ending_a_session_detaches_its_links() -> None:
    client, server = opened_pair()
    sender, _ = linked(client, server)
    server.end(server.sessions[0], Error(condition=errors.RESOURCE_DELETED, description="gone"))
    ev_c, _ = pump(client, server)
    (detached,) = of(ev_c, LinkDetached)
    assert detached.link is sender and detached.closed and detached.by_peer
    assert detached.error is not None and detached.error.condition == errors.RESOURCE_DELETED
    assert [type(e) for e in ev_c] == [LinkDetached, SessionEnded]


def test_refused_pipelined_attach_reports_null_terminus_then_detach() -> None:
    client, server = opened_pair()
    session = client.begin()
    sender = client.attach(
        session,
        name="x",
        role=ROLE_SENDER,
        source=Source(address="a"),
        target=Target(address="nowhere"),
    )
    client.send(sender, b"\x00Sw\x40", presume_credit=True)
    (req,) = of(server.receive_data(client.data_to_send()), LinkAttachRequested)
    server.refuse_attach(req.link, Error(condition=errors.NOT_FOUND, description="no node"))
    assert server.resume_input() == []  # the pipelined transfer is dropped quietly
    data = server.data_to_send()
    out = frames(data)
    assert [type(f) for f in out] == [Begin, Attach, Detach]
    assert out[1].target is None and out[2].closed and out[2].error.condition == errors.NOT_FOUND
    begun, attached, detached = client.receive_data(data)
    assert isinstance(begun, SessionBegun)
    assert isinstance(attached, LinkAttached) and attached.link.remote_target is None
    assert isinstance(detached, LinkDetached) and detached.error is not None
    assert detached.error.condition == errors.NOT_FOUND


def test_a_transfer_dropped_on_a_refused_link_still_counts_its_delivery_id() -> None:
    """The peer numbers deliveries per session: one in flight on a link we refused (a
    pipelined request, LP-10) is dropped, and the next delivery is numbered after it."""
    client, server = opened_pair()
    good, _ = linked(client, server)  # a link that works, and has carried delivery 0

    def deliver() -> list[MessageReceived]:
        client.send(good, b"\x00Sw\x40")
        events = server.receive_data(client.data_to_send())
        assert not of(events, ProtocolViolation)
        return of(events, MessageReceived)

    assert [e.delivery.delivery_id for e in deliver()] == [0]
    doomed = client.attach(
        client.sessions[0], name="x", role=ROLE_SENDER, source=Source("a"), target=Target("nowhere")
    )
    client.send(doomed, b"\x00Sw\x40", presume_credit=True)  # delivery 1
    (req,) = of(server.receive_data(client.data_to_send()), LinkAttachRequested)
    server.refuse_attach(req.link, Error(condition=errors.NOT_FOUND))
    assert server.resume_input() == []  # dropped, but counted
    client.receive_data(server.data_to_send())
    assert [e.delivery.delivery_id for e in deliver()] == [2]


def test_detaching_before_the_answer_came_is_legal_when_the_frames_cross() -> None:
    """We detach a link whose attach the peer has not answered yet; the peer's attach (and
    then its detach) cross ours on the wire. The late attach is no protocol error."""
    client, server = opened_pair()
    session = client.begin()
    sender = client.attach(
        session, name="x", role=ROLE_SENDER, source=Source(address="a"), target=Target("b")
    )
    (req,) = of(server.receive_data(client.data_to_send()), LinkAttachRequested)
    server.refuse_attach(req.link, Error(condition=errors.NOT_FOUND, description="no node"))
    answer = server.data_to_send()  # in flight while the client detaches
    client.detach(sender, closed=True)
    events = client.receive_data(answer)
    assert not of(events, ProtocolViolation) and not client.closed
    (detached,) = of(events, LinkDetached)
    assert detached.link is sender and not detached.by_peer
    events_s = server.receive_data(client.data_to_send())
    assert not of(events_s, ProtocolViolation) and not server.closed
    assert not session.links  # nothing of the link is left on either side


# -- SASL ------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 1])
def test_sasl_plain_then_pipelined_open(chunk: int | None) -> None:
    client, server = sasl_engine_pair(
        SaslClient.plain("alice", "s3cret"), SaslServer.with_users({"alice": "s3cret"})
    )
    client.open()
    first = client.data_to_send()
    assert first == SASL_HEADER  # the open waits for the SASL outcome
    server.open()
    ev_s = server.receive_data(first)
    ev_c, ev_s2 = pump(client, server, chunk=chunk)
    ev_s += ev_s2
    (done_c,) = of(ev_c, SaslDone)
    (done_s,) = of(ev_s, SaslDone)
    assert done_c.outcome == 0 and done_s.identity == "alice" and done_s.mechanism == "PLAIN"
    assert of(ev_c, ConnectionOpened) and of(ev_s, ConnectionOpened)
    assert server.sasl_identity == "alice"


def test_sasl_wrong_password_gets_auth_outcome_and_hangs_up() -> None:
    client, server = sasl_engine_pair(
        SaslClient.plain("alice", "wrong"), SaslServer.with_users({"alice": "s3cret"})
    )
    client.open()
    ev_c, ev_s = pump(client, server)
    assert of(ev_c, SaslDone)[0].outcome == 1 and of(ev_s, SaslDone)[0].outcome == 1
    assert not of(ev_c, ConnectionOpened)
    assert client.transport_done and server.transport_done


def test_sasl_anonymous() -> None:
    client, server = sasl_engine_pair(SaslClient.anonymous(), SaslServer())
    client.open()
    server.open()
    ev_c, ev_s = pump(client, server)
    assert of(ev_c, ConnectionOpened) and of(ev_s, SaslDone)[0].mechanism == "ANONYMOUS"


def test_sasl_mechanism_not_offered_fails_the_transport() -> None:
    client, server = sasl_engine_pair(SaslClient.plain("a", "b"), SaslServer())
    client.open()
    ev_c, _ = pump(client, server)
    assert of(ev_c, TransportFailed) and client.transport_done


# -- protocol headers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x01\x01\x00\x00",
        b"AMQP\x00\x02\x00\x00",
        b"HTTP/1.1",
        SASL_HEADER,
        b"AMQP\x02\x01\x00\x00",
    ],
)
def test_unsupported_header_is_answered_with_ours_then_hangup(header: bytes) -> None:
    _, server = engine_pair()
    events = server.receive_data(header)
    assert server.data_to_send() == AMQP_HEADER
    assert of(events, TransportFailed) and server.transport_done


def test_sasl_server_requiring_users_answers_plain_amqp_header_with_sasl_header() -> None:
    """(A server that lets anonymous peers in takes the plain header: test_plain_header.py.)"""
    sasl = SaslServer.with_users({"alice": "s3cret"})
    server = Connection(ConnectionConfig("s", sasl=sasl), initiator=False)
    server.receive_data(AMQP_HEADER)
    assert server.data_to_send() == SASL_HEADER and server.transport_done


# -- idle timeout ----------------------------------------------------------------------------


def test_heartbeats_are_sent_at_half_the_peer_idle_timeout() -> None:
    client, server = engine_pair(ConnectionConfig("c"), ConnectionConfig("s", idle_timeout=10.0))
    client.open()
    server.open()
    pump(client, server)
    client.tick(100.0)
    assert client.data_to_send() == b""
    assert client.next_deadline == 105.0
    client.tick(105.0)
    assert client.data_to_send() == HEARTBEAT
    before = server.receive_data(HEARTBEAT)
    assert before == []


def test_silent_peer_is_declared_dead_after_the_idle_timeout() -> None:
    client, server = engine_pair(ConnectionConfig("c", idle_timeout=2.0), ConnectionConfig("s"))
    client.open()
    server.open()
    pump(client, server)
    assert client.tick(50.0) == []
    assert client.next_deadline == 52.0
    events = client.tick(52.0)
    assert of(events, TransportFailed)
    (close,) = frames(client.data_to_send())
    assert close.error.condition == errors.RESOURCE_LIMIT_EXCEEDED
    assert client.transport_done


def test_connection_lost_is_a_failure_unless_closed_cleanly() -> None:
    client, server = opened_pair()
    assert of(client.connection_lost(), TransportFailed)
    client, server = opened_pair()
    client.close()
    pump(client, server)
    assert client.connection_lost() == []


def test_empty_input_is_the_peers_eof() -> None:
    """``receive_data(b"")`` ends the input, as in h11: a failure unless the close handshake
    finished, and nothing the peer sent is read after it."""
    client, server = opened_pair()
    assert of(client.receive_data(b""), TransportFailed)
    assert client.transport_done
    server.begin()
    assert client.receive_data(server.data_to_send()) == []
    client, server = opened_pair()
    client.close()
    pump(client, server)
    assert client.receive_data(b"") == []


def _paused_by_a_pipelined_attach(server_cfg: dict[str, Any]) -> tuple[Connection, Link]:
    """A server whose input waits behind a client's attach (a transfer follows it)."""
    client, server = opened_pair(**server_cfg)
    sender = client.attach(
        client.begin(), name="x", role=ROLE_SENDER, source=Source("a"), target=Target("q")
    )
    client.send(sender, b"\x00Sw\x40", presume_credit=True)
    events = server.receive_data(client.data_to_send())
    (req,) = of(events, LinkAttachRequested)
    assert server.input_paused and not of(events, MessageReceived)
    return server, req.link


def test_input_held_for_an_attach_goes_on_with_resume_input() -> None:
    server, link = _paused_by_a_pipelined_attach({})
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.flow(link, 1)
    (received,) = of(server.resume_input(), MessageReceived)
    assert received.link is link and not server.input_paused


def test_an_engine_that_dies_with_its_input_held_has_none_left_to_resume() -> None:
    server, _ = _paused_by_a_pipelined_attach({"idle_timeout": 10.0})
    server.tick(0.0)
    assert of(server.tick(20.0), TransportFailed)
    assert not server.input_paused  # a caller resuming while paused would spin forever
    assert server.resume_input() == []


# -- each error condition --------------------------------------------------------------------


def test_decode_error_for_a_body_that_is_not_amqp() -> None:
    _, server = opened_pair()
    bad = b"\x00\x00\x00\x0c\x02\x00\x00\x00\xff\xff\xff\xff"
    events, out = server_frames_after(server, bad)
    assert violation(events, out) == errors.DECODE_ERROR


@pytest.mark.parametrize(
    "header",
    [
        b"\x00\x00\x00\x04\x02\x00\x00\x00",  # size below 8
        b"\x00\x00\x00\x10\x01\x00\x00\x00",  # doff below 2
        b"\x00\x10\x00\x00\x02\x00\x00\x00",  # larger than our max-frame-size
        b"\x00\x00\x00\x08\x02\x07\x00\x00",  # unknown frame type
    ],
)
def test_framing_error(header: bytes) -> None:
    _, server = opened_pair()
    events, out = server_frames_after(server, header)
    assert violation(events, out) == errors.FRAMING_ERROR


def test_invalid_field_for_a_missing_mandatory_field() -> None:
    _, server = opened_pair()
    # begin with only remote-channel: next-outgoing-id etc. are mandatory
    events, out = server_frames_after(server, bytes.fromhex("0000000f02000000005311c0020140"))
    assert violation(events, out) == errors.INVALID_FIELD


def test_illegal_state_for_a_frame_before_open() -> None:
    _, server = engine_pair()
    server.receive_data(AMQP_HEADER)
    events = server.receive_data(
        raw(0, Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1))
    )
    out = frames(server.data_to_send(), headers=1)
    assert violation(events, out) == errors.ILLEGAL_STATE


def test_not_allowed_for_a_frame_on_a_channel_without_session() -> None:
    _, server = opened_pair()
    events, out = server_frames_after(
        server, raw(3, Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1))
    )
    assert violation(events, out) == errors.NOT_ALLOWED


def test_unattached_handle() -> None:
    _, server = opened_pair()
    begun(server)
    events, out = server_frames_after(
        server,
        raw(
            0,
            Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1, handle=9, link_credit=1),
        ),
    )
    assert violation(events, out) == errors.UNATTACHED_HANDLE


def test_handle_in_use() -> None:
    _, server = opened_pair()
    begun(server)
    attach_sender(server, handle=0, name="one")
    events, out = server_frames_after(
        server, raw(0, Attach(name="two", handle=0, role=ROLE_SENDER, initial_delivery_count=0))
    )
    assert violation(events, out) == errors.HANDLE_IN_USE


def _transfer(delivery_id: int) -> bytes:
    return raw(
        0,
        Transfer(
            handle=0, delivery_id=delivery_id, delivery_tag=b"t%d" % delivery_id, settled=True
        ),
        b"\x00Sw\x40",
    )


def test_window_violation() -> None:
    _, server = opened_pair(session_window=2)
    begun(server)
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.flow(link, 100)  # our flow says: 2 more transfer frames, no more
    server.data_to_send()
    events, out = server_frames_after(server, _transfer(0) + _transfer(1) + _transfer(2))
    assert len(of(events, MessageReceived)) == 2
    assert violation(events, out) == errors.WINDOW_VIOLATION


def test_window_is_refilled_once_half_used() -> None:
    _, server = opened_pair(session_window=4)
    begun(server)
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.flow(link, 100)
    server.data_to_send()
    server.receive_data(_transfer(0))
    assert server.data_to_send() == b""
    server.receive_data(_transfer(1))
    (refill,) = frames(server.data_to_send())
    assert refill.handle is None and refill.incoming_window == 4 and refill.next_incoming_id == 2


def test_transfer_limit_exceeded_detaches_the_link() -> None:
    _, server = opened_pair()
    begun(server)
    link = attach_sender(server)
    server.answer_attach(link, source=link.remote_source, target=link.remote_target)
    server.data_to_send()
    events = server.receive_data(_transfer(0))  # no credit was granted
    assert not of(events, MessageReceived)
    (detach,) = [f for f in frames(server.data_to_send()) if isinstance(f, Detach)]
    assert detach.closed and detach.error is not None
    assert detach.error.condition == errors.TRANSFER_LIMIT_EXCEEDED
    # frames still in flight for the detached link are dropped, not errors
    assert server.receive_data(_transfer(1)) == []
    events = server.receive_data(raw(0, Detach(handle=0, closed=True)))
    assert of(events, LinkDetached)[0].error.condition == errors.TRANSFER_LIMIT_EXCEEDED


def test_message_size_exceeded_detaches_the_link() -> None:
    client, server = opened_pair(max_message_size=1000)
    sender, receiver = linked(client, server)
    assert receiver.max_message_size == 1000
    assert sender.remote_attach is not None
    sender.remote_attach.max_message_size = None  # a sender that ignores the advertised limit
    client.send(sender, b"\x00Su\xb0\x00\x00\x07\xd0" + b"x" * 2000)
    _, ev = pump(client, server)
    assert not of(ev, MessageReceived)
    (detached,) = of(ev, LinkDetached)
    assert detached.error.condition == errors.MESSAGE_SIZE_EXCEEDED


def test_sender_refuses_locally_a_message_over_the_peer_limit() -> None:
    client, server = opened_pair(max_message_size=1000)
    sender, _ = linked(client, server)
    with pytest.raises(LocalProtocolError) as exc:
        client.send(sender, b"x" * 2000)
    assert exc.value.condition == errors.MESSAGE_SIZE_EXCEEDED


def test_input_after_a_violation_is_ignored() -> None:
    _, server = opened_pair()
    server.receive_data(b"\x00\x00\x00\x04\x02\x00\x00\x00")
    server.data_to_send()
    assert server.receive_data(raw(0, Open(container_id="again"))) == []
    assert server.data_to_send() == b""
