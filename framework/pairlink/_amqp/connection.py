"""The AMQP 1.0 connection engine (Part 2 §2.2-2.8, Part 5 §5.3), sans-IO.

Bytes go in through ``receive_data`` and come back as events (``receive_data(b"")``: the
peer's input has ended, as in h11); every action of the user (``open``, ``begin``, ``attach``,
``send``...) queues frames that ``data_to_send`` drains. Time enters only as numbers the caller
passes (``tick(now)``, and ``now`` with the bytes, so idle detection knows when input really
came). Anything illegal the peer sends is answered by a ``close`` carrying the right error
condition and reported as a ``ProtocolViolation``: nothing raised by bad input escapes
``receive_data``, and what a peer can make the engine hold has a bound in ``ConnectionConfig``.
Protocol headers and SASL are handshake.py's; sessions by channel and the session and link
performatives of the peer are channels.py's.

Pipelining is allowed where the spec allows it: frames queued before the peer's protocol
header, SASL outcome or open arrive are held and written in order as soon as the AMQP header
may go out, so open/begin/attach/flow/transfer can leave in one burst.
"""

from __future__ import annotations

from typing import Required, TypedDict

from . import errors
from .channels import DISPATCH, Channels
from .config import ConnectionConfig
from .errors import LocalProtocolError, RemoteProtocolError
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    Event,
    ProtocolViolation,
    TransportFailed,
)
from .framing import AMQP_HEADER, FRAME_AMQP, HEARTBEAT, Frame, FrameReader, encode_frame
from .handshake import Handshake, Phase
from .link import UINT_MAX, Delivery, Forward, IncomingBytes, Link, LinkState
from .liveness import Due, Liveness
from .messaging import DeliveryState, Error, Source, Target
from .performatives import (
    MIN_MAX_FRAME_SIZE,
    RCV_FIRST,
    ROLE_SENDER,
    SND_MIXED,
    SND_SETTLED,
    Close,
    Detach,
    Open,
    Performative,
    Transfer,
)
from .session import Session, SessionState
from .transfer_codec import encode_first_transfer, encode_transfer_frame
from .types import Fields, Symbol


class AnswerFields(TypedDict, total=False):
    """What our attach may set, besides its termini, when it answers a peer's
    (:meth:`Connection.answer_attach`)."""

    snd_settle_mode: int | None
    rcv_settle_mode: int | None
    properties: Fields | None
    max_message_size: int | None
    offered_capabilities: list[Symbol] | None


class AttachFields(TypedDict, total=False):
    """What :meth:`Connection.attach` takes besides the session and our role."""

    name: Required[str]
    source: Required[Source | None]
    target: Required[Target | None]
    snd_settle_mode: int
    rcv_settle_mode: int
    properties: Fields | None
    max_message_size: int | None
    offered_capabilities: list[Symbol] | None
    desired_capabilities: list[Symbol] | None


__all__ = ["Connection", "ConnectionConfig"]  # (ConnectionConfig lives in config.py)


class Connection:
    """One AMQP connection, either end. ``initiator`` writes the first protocol header."""

    def __init__(self, config: ConnectionConfig, *, initiator: bool) -> None:
        self.config = config
        self.initiator = initiator
        self.remote_open: Open | None = None
        self.transport_done = False
        self._reader = FrameReader(config.max_frame_size, config.max_decoded_elements)
        self._incoming = IncomingBytes(config.max_incomplete_bytes)
        self._channels = Channels(
            config, self._incoming, self._write, self.detach, self._pause_input
        )
        self._out = bytearray()
        self._held = bytearray()  # frames queued before our AMQP header may be written
        self._handshake = Handshake(config.sasl, initiator=initiator, out=self._out)
        self._amqp_out = self._handshake.amqp_header_written  # frames go straight to _out
        self._open_sent = False
        self._close_sent = False
        self._close_received = False
        self._peer_max_frame = MIN_MAX_FRAME_SIZE  # until the peer's open says otherwise
        self._liveness = Liveness(config.idle_timeout)
        self.next_deadline: float | None = None
        self.input_paused = False  # True after a LinkAttachRequested: answer, then resume
        self._relaying = False  # a link of ours passes messages through (``pass_through``)

    # -- state the layers above read -------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._close_sent or self._close_received or self._handshake.phase is Phase.DONE

    @property
    def sessions(self) -> dict[int, Session]:
        """Our sessions by our channel."""
        return self._channels.sessions

    @property
    def sasl_identity(self) -> str | None:
        """Who the peer is (server side): the identity its SASL exchange established, or
        ``sasl.ANONYMOUS_IDENTITY`` if it skipped SASL; None until then, or with no SASL
        server configured."""
        return self._handshake.identity

    @property
    def input_size(self) -> int:
        """Bytes received and still held: unparsed input plus incomplete messages (bounded by
        ``max_incomplete_bytes``), for a layer that bounds memory across connections."""
        return self._reader.buffered + self._incoming.held

    @property
    def remote_offered_capabilities(self) -> list[str]:
        caps = self.remote_open.offered_capabilities if self.remote_open else None
        return [str(c) for c in caps or ()]

    # -- output ----------------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        """Whether ``data_to_send`` has anything (frames, or dispositions still to write)."""
        return bool(self._out) or bool(self._channels.dirty)

    @property
    def output_size(self) -> int:
        """Bytes queued for ``data_to_send`` (frames held behind the protocol header included)
        and transfers held until the peer opens its session window: what the layer above counts
        against its bound on bytes waiting for the peer."""
        size = len(self._out) + len(self._held)
        for session in self.sessions.values():  # a loop, not sum(): asked on every read
            size += session.blocked_bytes
        return size

    def data_to_send(self, now: float | None = None) -> bytes:
        """Every byte queued so far, in order; empty when there is nothing to write.

        ``now`` (the caller's clock) dates the write for the heartbeat schedule at once,
        instead of at the next ``tick``."""
        self._channels.flush_dispositions()
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._liveness.sent(now)
        return data

    def _write(
        self, channel: int, performative: Performative, payload: bytes | memoryview = b""
    ) -> None:
        if self._close_sent:  # nothing follows our close (§2.4.3): settling, granting credit or
            return  # detaching on events of input that ended in a close is then a no-op
        out = self._out if self._amqp_out else self._held
        if type(performative) is Transfer:  # what encode_frame would do, one call fewer
            encode_transfer_frame(out, channel, performative, payload)
        else:
            encode_frame(out, channel, performative, payload)

    def _start_amqp_output(self) -> None:
        """Our AMQP header goes out, then everything the user queued meanwhile."""
        self._out += AMQP_HEADER
        self._out += self._held
        self._held.clear()
        self._amqp_out = True

    # -- connection actions ----------------------------------------------------------------

    def open(self) -> None:
        if self._open_sent:
            raise LocalProtocolError(errors.ILLEGAL_STATE, "open was already sent")
        cfg = self.config
        self._open_sent = True
        self._write(
            0,
            Open(
                container_id=cfg.container_id,
                hostname=cfg.hostname,
                max_frame_size=cfg.max_frame_size,
                channel_max=cfg.channel_max,
                idle_time_out=None if cfg.idle_timeout is None else int(cfg.idle_timeout * 1000),
                offered_capabilities=[Symbol(c) for c in cfg.offered_capabilities] or None,
                desired_capabilities=[Symbol(c) for c in cfg.desired_capabilities] or None,
                properties=cfg.properties,
            ),
        )

    def close(self, error: Error | None = None) -> None:
        """Close (or answer the peer's close); idempotent."""
        if self._close_sent or (self._handshake.phase is Phase.DONE and not self._close_received):
            return
        if not self._open_sent:
            self.open()  # a close must follow an open (§2.4.1)
        self._channels.flush_dispositions()
        self._write(0, Close(error=error))
        self._close_sent = True
        if self._close_received:
            self._finish()

    def _finish(self) -> None:
        self._handshake.phase = Phase.DONE
        self.transport_done = True
        self.next_deadline = None
        self.input_paused = False  # nothing more is read: no input is left to resume

    # -- sessions --------------------------------------------------------------------------

    def begin(self) -> Session:
        self._check_usable()
        channel = self._channels.free()
        if channel is None:
            raise LocalProtocolError(errors.RESOURCE_LIMIT_EXCEEDED, "no free channel")
        session = self._channels.new(channel, SessionState.BEGIN_SENT)
        self._write(channel, session.begin_frame())
        return session

    def end(self, session: Session, error: Error | None = None) -> None:
        self._channels.end(session, error)

    def _check_usable(self) -> None:
        if self.closed:
            raise LocalProtocolError(errors.ILLEGAL_STATE, "the connection is closed")
        if not self._open_sent:
            raise LocalProtocolError(errors.ILLEGAL_STATE, "call open() first")

    # -- links -----------------------------------------------------------------------------

    def attach(
        self,
        session: Session,
        *,
        name: str,
        role: bool,
        source: Source | None,
        target: Target | None,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        properties: Fields | None = None,
        max_message_size: int | None = None,
        offered_capabilities: list[Symbol] | None = None,
        desired_capabilities: list[Symbol] | None = None,
    ) -> Link:
        """Start a link of ours; the peer's answer arrives as ``LinkAttached``."""
        self._check_usable()
        if session.state not in (SessionState.BEGIN_SENT, SessionState.MAPPED):
            raise LocalProtocolError(errors.ILLEGAL_STATE, "the session is not usable")
        if (name, role) in session.names:
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"a link {name!r} of this role exists")
        handle = session.free_handle()
        if handle is None:
            raise LocalProtocolError(errors.RESOURCE_LIMIT_EXCEEDED, "no free link handle")
        link = Link(
            session,
            name,
            handle,
            role,
            LinkState.ATTACH_SENT,
            source=source,
            target=target,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            properties=properties,
            max_message_size=max_message_size or self.config.max_message_size,
            offered_capabilities=offered_capabilities,
            desired_capabilities=desired_capabilities,
            max_unsettled=self.config.max_unsettled,
        )
        session.add_link(link)
        self._write(session.channel, link.attach_frame(link.source, link.target))
        return link

    def answer_attach(
        self,
        link: Link,
        *,
        source: Source | None,
        target: Target | None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        properties: Fields | None = None,
        max_message_size: int | None = None,
        offered_capabilities: list[Symbol] | None = None,
    ) -> None:
        """Answer a ``LinkAttachRequested`` with our attach; the link is then attached."""
        if link.state is not LinkState.ATTACH_RECEIVED:
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"link {link.name!r} needs no answer")
        remote = link.remote_attach
        assert remote is not None
        link.source, link.target = source, target
        link.snd_settle_mode = (
            remote.snd_settle_mode if snd_settle_mode is None else snd_settle_mode
        )
        link.rcv_settle_mode = (
            remote.rcv_settle_mode if rcv_settle_mode is None else rcv_settle_mode
        )
        link.properties = properties
        link.offered_capabilities = offered_capabilities
        link.max_message_size = max_message_size or self.config.max_message_size
        link.state = LinkState.ATTACHED
        self._write(link.session.channel, link.attach_frame(source, target))

    def refuse_attach(self, link: Link, error: Error) -> None:
        """Refuse a peer's link the way §2.6.3 prescribes: an attach with a null local
        terminus, then at once a closing detach that carries the reason."""
        if link.state is not LinkState.ATTACH_RECEIVED:
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"link {link.name!r} needs no answer")
        remote = link.remote_attach
        assert remote is not None
        if link.is_sender:  # our terminus is the source
            link.source, link.target = None, remote.target
        else:
            link.source, link.target = remote.source, None
        link.state = LinkState.ATTACHED
        self._write(link.session.channel, link.attach_frame(link.source, link.target))
        self.detach(link, closed=True, error=error)

    def detach(self, link: Link, *, closed: bool = True, error: Error | None = None) -> None:
        if link.state in (LinkState.DETACH_SENT, LinkState.DETACHED):
            return
        if link.state is LinkState.ATTACH_RECEIVED:
            self.refuse_attach(link, error or Error(condition=errors.NOT_ALLOWED))
            return
        session = link.session
        session.flush_dispositions()
        link.state = LinkState.DETACH_SENT
        link.discard_partial()  # the rest of it is dropped on arrival
        link.detach_error = error
        self._write(session.channel, Detach(handle=link.handle, closed=closed, error=error))

    def flow(self, link: Link, credit: int, *, drain: bool = False, echo: bool = False) -> None:
        """As receiver: set the link's credit to ``credit`` (absolute, §2.6.7)."""
        if link.state not in (LinkState.ATTACH_SENT, LinkState.ATTACHED):
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"link {link.name!r} is not attached")
        if not 0 <= credit <= UINT_MAX:
            raise LocalProtocolError(errors.INVALID_FIELD, f"link-credit {credit} is not a uint")
        if link.is_receiver:
            link.link_credit = credit
            link.drain = drain
        self._write(link.session.channel, link.session.flow_frame(link, echo=echo))

    def complete_drain(self, link: Link) -> None:
        """As sender with nothing more to send, when the receiver asked to drain (``LinkFlow``
        with ``link.drain``): advance delivery-count by the credit left, zero it and tell the
        receiver with a flow (§2.6.7). Nothing happens without drain or credit, or once the
        link is detaching."""
        if link.is_sender and link.drain and link.link_credit and link.state is LinkState.ATTACHED:
            link.drain_credit()
            self._write(link.session.channel, link.session.flow_frame(link))

    def send(
        self,
        link: Link,
        payload: bytes | memoryview,
        *,
        tag: bytes | None = None,
        settled: bool | None = None,
        message_format: int = 0,
        presume_credit: bool = False,
    ) -> Delivery:
        """Send one message, split into frames the peer's max-frame-size allows, after the
        dispositions queued so far (an answer is written after the outcome of what it answers,
        which azure-uamqp requires).

        ``presume_credit`` sends without credit while our attach is unanswered: the LP-10
        pipelining of an initiator that knows the responder grants credit on attach.
        """
        if link.role is not ROLE_SENDER or (
            link.state is not LinkState.ATTACHED and link.state is not LinkState.ATTACH_SENT
        ):  # (is_sender and a tuple's 'in', spelled out: once per message)
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"cannot send on link {link.name!r}")
        if link.link_credit <= 0 and not (presume_credit and link.remote_attach is None):
            raise LocalProtocolError(errors.TRANSFER_LIMIT_EXCEEDED, "no link credit")
        if settled is None:
            settled = link.snd_settle_mode == SND_SETTLED
        if not settled and link.unsettled >= link.max_unsettled:
            raise LocalProtocolError(
                errors.RESOURCE_LIMIT_EXCEEDED,
                f"{link.unsettled} deliveries on {link.name!r} wait for the peer to settle them "
                f"(max_unsettled {link.max_unsettled}): wait until link.send_blocked is False",
            )
        limit = link.remote_max_message_size
        if limit is not None and len(payload) > limit:
            raise LocalProtocolError(
                errors.MESSAGE_SIZE_EXCEEDED, f"{len(payload)} bytes exceed the peer's {limit}"
            )
        if self._channels.dirty:  # outcomes declared before this message go out before it:
            self._channels.flush_dispositions()  # a reply never overtakes its request's
        return link.session.send(
            link,
            payload,
            tag=link.next_tag() if tag is None else tag,
            settled=settled,
            message_format=message_format,
            max_frame_size=self._peer_max_frame,
        )

    def pass_through(self, link: Link, forward: Forward) -> None:
        """As receiver: hand every whole pre-settled message of format 0 that comes in one
        frame of the usual shape on ``link`` to ``forward`` (a relay, which sends it on with
        ``Connection.forward``) as its frame is read: no ``Delivery``, no event, no decoding
        of more than that frame's transfer. What ``forward`` declines, and every other
        message, arrives as ``MessageReceived``. No message overtakes an earlier one of its
        link; one passed through may go out ahead of what events of the same input cause
        on other links (a flow)."""
        link.forward = forward
        self._relaying = True

    def forward(self, link: Link, payload: bytes | bytearray | memoryview) -> bool:
        """``send(link, payload, settled=True)`` for a relay's pass-through (``Link.forward``)
        when the message goes out at once in one frame; False, and nothing done, for anything
        less plain (``send`` then says what): the link not an attached sender with usable
        credit, the message larger than the peer takes, its session's window closed, our
        output held or closed."""
        if (
            link.role is not ROLE_SENDER
            or link.state is not LinkState.ATTACHED
            or link.usable_credit <= 0
            or self._close_sent
            or not self._amqp_out
        ):
            return False
        size = len(payload)
        limit = link.remote_max_message_size
        if limit is not None and size > limit:
            return False
        session = link.session
        delivery_id = session.forward(link, size, self._peer_max_frame)
        if delivery_id is None:
            return False
        tag = link.next_tag()
        channel, handle = session.channel, link.handle
        encode_first_transfer(self._out, channel, handle, delivery_id, tag, 0, True, payload)
        return True

    def settle(
        self, delivery: Delivery, state: DeliveryState | None = None, *, settled: bool = True
    ) -> None:
        """Declare ``state`` for a delivery (and settle it); dispositions go out in ranges."""
        session = delivery.link.session
        session.settle(delivery, state, settled)
        self._channels.dirty.add(session)

    # -- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Event]:
        """Heartbeats and the idle timeout, from a clock only the caller knows.

        Input and output are dated by the ``now`` given to ``receive_data``/``data_to_send``
        when the caller passes one (so the peer is declared dead within the idle timeout of
        its last frame), else by the first ``tick`` that sees them."""
        events: list[Event] = []
        if self._handshake.phase is Phase.DONE:
            return events
        may_write = self._amqp_out and not self._close_sent
        due, self.next_deadline = self._liveness.check(
            now, watching=self._open_sent, may_write=may_write
        )
        if due is Due.DEAD:
            self._fail(errors.RESOURCE_LIMIT_EXCEEDED, "local-idle-timeout expired", events)
            events.append(TransportFailed("the peer sent nothing within the idle timeout"))
        elif due is Due.HEARTBEAT:
            self._out += HEARTBEAT
        return events

    def connection_lost(self) -> list[Event]:
        """The byte stream is gone (the peer's EOF, or a failed read or write); unless the
        close handshake finished, that is a failure (``TransportFailed``)."""
        if self._handshake.phase is Phase.DONE and self._close_received:
            return []
        was_done = self._handshake.phase is Phase.DONE
        self._finish()
        return [] if was_done else [TransportFailed("connection lost")]

    # -- input -----------------------------------------------------------------------------

    def receive_data(
        self, data: bytes | bytearray | memoryview, now: float | None = None
    ) -> list[Event]:
        """Feed received bytes; returns what they meant. Never raises.

        Empty ``data`` is the peer's EOF: the same as ``connection_lost``. Reading stops after
        a ``LinkAttachRequested`` (``input_paused`` is then True): answer the attach, then call
        ``resume_input`` to go on with the bytes already received. ``now`` (the caller's clock
        when the bytes arrived) is the last input time that the idle timeout counts from. A
        peer's breach closes the connection with its condition; a fault of ours while handling
        input (a bug, a failing SASL callback) closes it with ``amqp:internal-error`` and
        reports the exception as the violation's ``cause``.
        """
        if not data:
            return self.connection_lost()
        events: list[Event] = []
        if self._handshake.phase is Phase.DONE:
            return events
        self._liveness.received(now)
        self._reader.feed(data)
        self._read(events)
        return events

    def resume_input(self) -> list[Event]:
        """Go on reading the bytes already received, once the ``LinkAttachRequested`` that
        paused the input (``input_paused``) is answered; returns what they meant, as
        ``receive_data`` does, and may pause again at the next attach request."""
        events: list[Event] = []
        if self._handshake.phase is not Phase.DONE:
            self._read(events)
        return events

    def _read(self, events: list[Event]) -> None:
        """Turn the buffered input into events until it runs out or pauses again."""
        self.input_paused = False
        self._channels.batch += 1  # what passes through must not overtake these events
        try:
            self._process(events)
            self._channels.write_refills()
        except RemoteProtocolError as exc:
            self._fail(exc.condition, exc.description, events)
        except Exception as exc:  # the backstop: one connection's fault stays in it
            self._fail(errors.INTERNAL_ERROR, f"{type(exc).__name__} handling input", events, exc)

    def _process(self, events: list[Event]) -> None:
        reader = self._reader
        handshake = self._handshake
        on_transfer = self._channels.on_transfer
        pass_through = self._channels.pass_through
        while not self.input_paused:
            phase = handshake.phase
            if phase is Phase.FRAMES:
                # a frame of links that pass messages through (only of attached links, so in
                # an open connection: after a close, the phase is done and nothing is read)
                if self._relaying and reader.pass_through(pass_through):
                    continue
                frame = reader.read_frame()
                if frame is None:
                    return
                perf = frame.performative
                if type(perf) is not Transfer or self.remote_open is None or self._close_received:
                    self._on_frame(frame, events)
                else:  # the hot path: a transfer in an open connection
                    on_transfer(frame.channel, perf, frame.payload, events)
                continue
            if phase is Phase.SASL:
                frame = reader.read_frame()
                if frame is None:
                    return
                handshake.on_sasl_frame(frame, events)
            elif phase is Phase.HEADER or phase is Phase.AMQP_HEADER:
                header = reader.read_protocol_header()
                if header is None:
                    return
                handshake.on_header(header, events)
            else:
                return
            self._after_handshake_step()

    def _pause_input(self) -> None:
        """Stop reading until the user has answered a ``LinkAttachRequested``."""
        self.input_paused = True

    def _after_handshake_step(self) -> None:
        """Follow the handshake: our AMQP header (and the frames held behind it) goes out when
        the peer's arrives, or, for a SASL client, once the outcome is ok (§5.3.2)."""
        phase = self._handshake.phase
        if phase is Phase.DONE:
            self._finish()
        elif phase is Phase.FRAMES:
            self._reader.max_frame_size = self.config.max_frame_size
            if not self._amqp_out:
                self._start_amqp_output()
        elif phase is Phase.AMQP_HEADER and self.initiator and not self._amqp_out:
            self._start_amqp_output()

    def _on_frame(self, frame: Frame, events: list[Event]) -> None:
        perf = frame.performative
        if perf is None:
            return  # heartbeat: its bytes were input (see receive_data), nothing else to do
        if frame.type != FRAME_AMQP:
            raise RemoteProtocolError(errors.FRAMING_ERROR, "SASL frame after SASL")
        kind = type(perf)
        if kind is Transfer:  # (a transfer in an open connection never comes here: _process)
            raise RemoteProtocolError(errors.ILLEGAL_STATE, "transfer outside an open connection")
        if self.remote_open is None:
            if kind is not Open:
                raise RemoteProtocolError(errors.ILLEGAL_STATE, f"{kind.__name__} before open")
            self._on_open(perf, events)
            return
        if self._close_received:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, f"{kind.__name__} after close")
        if kind is Close:
            self._on_close(perf, events)
            return
        handler = DISPATCH.get(kind)
        if handler is None:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, f"unexpected {kind.__name__}")
        handler(self._channels, frame.channel, perf, events)

    def _on_open(self, perf: Open, events: list[Event]) -> None:
        if perf.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise RemoteProtocolError(
                errors.INVALID_FIELD, f"max-frame-size {perf.max_frame_size} is below 512"
            )
        if perf.idle_time_out and perf.idle_time_out / 1000 < self.config.min_peer_idle_timeout:
            raise RemoteProtocolError(
                errors.INVALID_FIELD,
                f"idle-time-out {perf.idle_time_out} ms is below the "
                f"{self.config.min_peer_idle_timeout * 1000:.0f} ms we heartbeat for",
            )
        self.remote_open = perf
        self._channels.peer_channel_max = perf.channel_max
        if not self._open_sent:  # answer at once: begin/attach replies must follow our open
            self.open()
        self._peer_max_frame = min(perf.max_frame_size, 0xFFFFFFFF)
        if perf.idle_time_out:
            self._liveness.remote = perf.idle_time_out / 1000
        events.append(ConnectionOpened(perf))

    def _on_close(self, perf: Close, events: list[Event]) -> None:
        self._close_received = True
        by_peer = not self._close_sent
        if by_peer:
            self.close()
        self._finish()
        events.append(ConnectionClosed(perf.error, by_peer))

    # -- failure ---------------------------------------------------------------------------

    def _fail(
        self,
        condition: str,
        description: str,
        events: list[Event],
        cause: BaseException | None = None,
    ) -> None:
        """Close with ``condition`` at once and stop reading: the peer broke the protocol (or,
        with ``cause``, handling its input failed here)."""
        events.append(ProtocolViolation(condition, description, cause))
        if not self._close_sent and self._amqp_out:
            if not self._open_sent:
                self.open()
            self._write(0, Close(error=Error(condition=condition, description=description)))
            self._close_sent = True
        # before our AMQP header (a broken SASL exchange) no close can be said: just hang up
        self._finish()
