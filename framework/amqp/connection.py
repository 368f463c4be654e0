"""The AMQP 1.0 connection engine (Part 2 §2.2-2.8, Part 5 §5.3), sans-IO.

Bytes go in through ``receive_data`` and come back as events; every action of the user
(``open``, ``begin``, ``attach``, ``send``...) queues frames that ``data_to_send`` drains. Time
enters only through ``tick(now)``. Anything illegal the peer sends is answered by a ``close``
carrying the right error condition and reported as a ``ProtocolViolation``: nothing raised by
bad input escapes ``receive_data``.

Pipelining is allowed where the spec allows it: frames queued before the peer's protocol
header, SASL outcome or open arrive are held and written in order as soon as the AMQP header
may go out, so open/begin/attach/flow/transfer can leave in one burst.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import attrs

from . import errors
from .errors import LocalProtocolError, RemoteProtocolError
from .events import (
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
from .framing import (
    AMQP_HEADER,
    FRAME_AMQP,
    FRAME_SASL,
    HEARTBEAT,
    SASL_HEADER,
    Frame,
    FrameReader,
    encode_frame,
)
from .link import Delivery, Link, LinkError, LinkState
from .messaging import Error, Source, Target
from .performatives import (
    MIN_MAX_FRAME_SIZE,
    RCV_FIRST,
    ROLE_SENDER,
    SASL_OK,
    SND_MIXED,
    SND_SETTLED,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from .sasl import SaslClient, SaslFailed, SaslServer
from .session import Session, SessionState
from .types import Symbol


@attrs.define
class ConnectionConfig:
    """What we announce in our open and the limits we hold the peer to."""

    container_id: str
    hostname: str | None = None
    max_frame_size: int = 65536
    channel_max: int = 255
    idle_timeout: float | None = None  # seconds of silence after which the peer is dead
    offered_capabilities: Sequence[str] = ()
    desired_capabilities: Sequence[str] = ()
    properties: dict[Any, Any] | None = None
    max_message_size: int = 64 * 2**20  # the largest incoming message we reassemble
    session_window: int = 65536  # incoming window of our sessions, in transfer frames
    sasl: SaslClient | SaslServer | None = None


class _Input(enum.Enum):
    HEADER = "header"  # expecting the first protocol header (SASL or AMQP)
    SASL = "sasl"  # SASL frames
    AMQP_HEADER = "amqp-header"  # the AMQP header that follows a successful SASL exchange
    FRAMES = "frames"
    DONE = "done"  # closed or failed: input is ignored


class Connection:
    """One AMQP connection, either end. ``initiator`` writes the first protocol header."""

    def __init__(self, config: ConnectionConfig, *, initiator: bool) -> None:
        self.config = config
        self.initiator = initiator
        self.remote_open: Open | None = None
        self.sasl_identity: str | None = None
        self.transport_done = False
        self.sessions: dict[int, Session] = {}
        self._remote_sessions: dict[int, Session] = {}
        self._reader = FrameReader(config.max_frame_size)
        self._out = bytearray()
        self._held = bytearray()  # frames queued before our AMQP header may be written
        self._amqp_out = False  # our AMQP header is written: frames go straight to _out
        self._input = _Input.HEADER
        self._open_sent = False
        self._close_sent = False
        self._close_received = False
        self._peer_max_frame = MIN_MAX_FRAME_SIZE  # until the peer's open says otherwise
        self._remote_idle: float | None = None
        self._dirty_sessions: set[Session] = set()  # sessions with queued dispositions
        self._refill: set[Session] = set()  # sessions whose incoming window runs low
        self._rx_frames = 0
        self._rx_seen = -1
        self._rx_mark = 0.0
        self._tx_writes = 0
        self._tx_seen = -1
        self._tx_mark = 0.0
        self.next_deadline: float | None = None
        self.input_paused = False  # True after a LinkAttachRequested: answer, then resume
        if initiator:
            self._out += SASL_HEADER if config.sasl is not None else AMQP_HEADER
            self._amqp_out = config.sasl is None

    # -- state the layers above read -------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._close_sent or self._close_received or self._input is _Input.DONE

    @property
    def remote_offered_capabilities(self) -> list[str]:
        caps = self.remote_open.offered_capabilities if self.remote_open else None
        return [str(c) for c in caps or ()]

    # -- output ----------------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        """Whether ``data_to_send`` has anything (frames, or dispositions still to write)."""
        return bool(self._out) or bool(self._dirty_sessions)

    def data_to_send(self) -> bytes:
        """Every byte queued so far, in order; empty when there is nothing to write."""
        self._flush_all_dispositions()
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._tx_writes += 1
        return data

    def _write(self, channel: int, performative: Any, payload: bytes | memoryview = b"") -> None:
        encode_frame(self._out if self._amqp_out else self._held, channel, performative, payload)

    def _write_sasl(self, performative: Any) -> None:
        encode_frame(self._out, 0, performative, b"", FRAME_SASL)

    def _start_amqp_output(self) -> None:
        """Our AMQP header goes out, then everything the user queued meanwhile."""
        self._out += AMQP_HEADER
        self._out += self._held
        self._held.clear()
        self._amqp_out = True

    def _session_writer(self, session: Session) -> Any:
        def write(performative: Any, payload: bytes | memoryview) -> None:
            self._write(session.channel, performative, payload)

        return write

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
        if self._close_sent or (self._input is _Input.DONE and not self._close_received):
            return
        if not self._open_sent:
            self.open()  # a close must follow an open (§2.4.1)
        self._flush_all_dispositions()
        self._close_sent = True
        self._write(0, Close(error=error))
        if self._close_received:
            self._finish()

    def _finish(self) -> None:
        self._input = _Input.DONE
        self.transport_done = True
        self.next_deadline = None

    # -- sessions --------------------------------------------------------------------------

    def begin(self) -> Session:
        self._check_usable()
        channel = self._free_channel()
        session = self._new_session(channel, SessionState.BEGIN_SENT)
        self._write(channel, session.begin_frame())
        return session

    def end(self, session: Session, error: Error | None = None) -> None:
        if session.state in (SessionState.END_SENT, SessionState.ENDED):
            return
        session.flush_dispositions()
        self._dirty_sessions.discard(session)
        session.state = SessionState.END_SENT
        self._write(session.channel, End(error=error))

    def _new_session(self, channel: int, state: SessionState) -> Session:
        session = Session(
            channel, self._write_placeholder, state, incoming_window_size=self.config.session_window
        )
        session.write = self._session_writer(session)
        self.sessions[channel] = session
        return session

    @staticmethod
    def _write_placeholder(_performative: Any, _payload: bytes | memoryview) -> None:
        raise AssertionError("session writer not bound")

    def _free_channel(self) -> int:
        limit = self.config.channel_max
        if self.remote_open is not None:
            limit = min(limit, self.remote_open.channel_max)
        for channel in range(limit + 1):
            if channel not in self.sessions:
                return channel
        raise LocalProtocolError(errors.RESOURCE_LIMIT_EXCEEDED, "no free channel")

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
        properties: dict[Any, Any] | None = None,
        max_message_size: int | None = None,
        offered_capabilities: list[Any] | None = None,
        desired_capabilities: list[Any] | None = None,
    ) -> Link:
        """Start a link of ours; the peer's answer arrives as ``LinkAttached``."""
        self._check_usable()
        if session.state not in (SessionState.BEGIN_SENT, SessionState.MAPPED):
            raise LocalProtocolError(errors.ILLEGAL_STATE, "the session is not usable")
        if (name, role) in session.names:
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"a link {name!r} of this role exists")
        link = Link(
            session,
            name,
            session.allocate_handle(),
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
        )
        session.add_link(link)
        self._write(session.channel, self._attach_frame(link, link.source, link.target))
        return link

    def answer_attach(
        self,
        link: Link,
        *,
        source: Source | None,
        target: Target | None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        properties: dict[Any, Any] | None = None,
        max_message_size: int | None = None,
        offered_capabilities: list[Any] | None = None,
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
        self._write(link.session.channel, self._attach_frame(link, source, target))

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
        self._write(link.session.channel, self._attach_frame(link, link.source, link.target))
        self.detach(link, closed=True, error=error)

    def _attach_frame(self, link: Link, source: Source | None, target: Target | None) -> Attach:
        return Attach(
            name=link.name,
            handle=link.handle,
            role=link.role,
            snd_settle_mode=link.snd_settle_mode,
            rcv_settle_mode=link.rcv_settle_mode,
            source=source,
            target=target,
            initial_delivery_count=link.delivery_count if link.is_sender else None,
            max_message_size=link.max_message_size if link.is_receiver else None,
            offered_capabilities=link.offered_capabilities,
            desired_capabilities=link.desired_capabilities,
            properties=link.properties,
        )

    def detach(self, link: Link, *, closed: bool = True, error: Error | None = None) -> None:
        if link.state in (LinkState.DETACH_SENT, LinkState.DETACHED):
            return
        if link.state is LinkState.ATTACH_RECEIVED:
            self.refuse_attach(link, error or Error(condition=errors.NOT_ALLOWED))
            return
        session = link.session
        session.flush_dispositions()
        link.state = LinkState.DETACH_SENT
        link.detach_error = error
        self._write(session.channel, Detach(handle=link.handle, closed=closed, error=error))

    def flow(self, link: Link, credit: int, *, drain: bool = False, echo: bool = False) -> None:
        """As receiver: set the link's credit to ``credit`` (absolute, §2.6.7)."""
        if link.state not in (LinkState.ATTACH_SENT, LinkState.ATTACHED):
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"link {link.name!r} is not attached")
        if link.is_receiver:
            link.link_credit = credit
            link.drain = drain
        self._write(link.session.channel, link.session.flow_frame(link, echo=echo))

    def complete_drain(self, link: Link) -> None:
        """As sender with nothing more to send: use up the credit the receiver is draining."""
        if link.is_sender and link.drain and link.link_credit:
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
        """Send one message, split into frames the peer's max-frame-size allows.

        ``presume_credit`` sends without credit while our attach is unanswered: the LP-10
        pipelining of an initiator that knows the responder grants credit on attach.
        """
        if not link.is_sender or link.state not in (LinkState.ATTACH_SENT, LinkState.ATTACHED):
            raise LocalProtocolError(errors.ILLEGAL_STATE, f"cannot send on link {link.name!r}")
        if link.link_credit <= 0 and not (presume_credit and link.remote_attach is None):
            raise LocalProtocolError(errors.TRANSFER_LIMIT_EXCEEDED, "no link credit")
        limit = link.remote_max_message_size
        if limit is not None and len(payload) > limit:
            raise LocalProtocolError(
                errors.MESSAGE_SIZE_EXCEEDED, f"{len(payload)} bytes exceed the peer's {limit}"
            )
        if settled is None:
            settled = link.snd_settle_mode == SND_SETTLED
        return link.session.send(
            link,
            payload,
            tag=link.next_tag() if tag is None else tag,
            settled=settled,
            message_format=message_format,
            max_frame_size=self._peer_max_frame,
        )

    def settle(self, delivery: Delivery, state: Any = None, *, settled: bool = True) -> None:
        """Declare ``state`` for a delivery (and settle it); dispositions go out in ranges."""
        session = delivery.link.session
        session.settle(delivery, state, settled)
        self._dirty_sessions.add(session)

    def _flush_all_dispositions(self) -> None:
        for session in self._dirty_sessions:
            session.flush_dispositions()
        self._dirty_sessions.clear()

    # -- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Event]:
        """Heartbeats and the idle timeout, from a clock only the caller knows."""
        events: list[Event] = []
        if self._input is _Input.DONE:
            return events
        if self._rx_frames != self._rx_seen:
            self._rx_seen, self._rx_mark = self._rx_frames, now
        if self._tx_writes != self._tx_seen:
            self._tx_seen, self._tx_mark = self._tx_writes, now
        deadlines = []
        local = self.config.idle_timeout
        if local is not None and self._open_sent:
            if now - self._rx_mark >= local:
                self._fail(errors.RESOURCE_LIMIT_EXCEEDED, "local-idle-timeout expired", events)
                events.append(TransportFailed("the peer sent nothing within the idle timeout"))
                return events
            deadlines.append(self._rx_mark + local)
        remote = self._remote_idle
        if remote and self._amqp_out and not self._close_sent:
            if now - self._tx_mark >= remote / 2:
                self._out += HEARTBEAT
                self._tx_mark = now
            deadlines.append(self._tx_mark + remote / 2)
        self.next_deadline = min(deadlines) if deadlines else None
        return events

    def connection_lost(self) -> list[Event]:
        """The byte stream is gone; unless the close handshake finished, that is a failure."""
        if self._input is _Input.DONE and self._close_received:
            return []
        was_done = self._input is _Input.DONE
        self._finish()
        return [] if was_done else [TransportFailed("connection lost")]

    # -- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed received bytes; returns what they meant. Never raises for bad input.

        Reading stops after a ``LinkAttachRequested`` (``input_paused`` is then True): answer
        the attach, then call ``receive_data(b"")`` to go on with the bytes still buffered.
        """
        events: list[Event] = []
        if self._input is _Input.DONE:
            return events
        self.input_paused = False
        self._reader.feed(data)
        try:
            self._process(events)
            # refill windows once per batch of input, not per frame: the peer learns of the
            # new window only from this flow, so frames beyond the old one stay violations
            for session in self._refill:
                if session.state is SessionState.MAPPED:
                    self._write(session.channel, session.flow_frame())
            self._refill.clear()
        except RemoteProtocolError as exc:
            self._fail(exc.condition, exc.description, events)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
            # a frame whose fields decode but hold values of the wrong type or range
            self._fail(errors.DECODE_ERROR, f"malformed frame field: {exc}", events)
        return events

    def _process(self, events: list[Event]) -> None:
        reader = self._reader
        while not self.input_paused:
            state = self._input
            if state is _Input.FRAMES or state is _Input.SASL:
                frame = reader.read_frame()
                if frame is None:
                    return
                self._rx_frames += 1
                if state is _Input.FRAMES:
                    self._on_frame(frame, events)
                else:
                    self._on_sasl_frame(frame, events)
            elif state is _Input.HEADER or state is _Input.AMQP_HEADER:
                header = reader.read_protocol_header()
                if header is None:
                    return
                self._rx_frames += 1
                self._on_header(header, events)
            else:
                return

    def _on_header(self, header: bytes, events: list[Event]) -> None:
        want_sasl = self._input is _Input.HEADER and self.config.sasl is not None
        expected = SASL_HEADER if want_sasl else AMQP_HEADER
        if header != expected:
            if not self.initiator:  # §2.2: answer with the header we support, then hang up
                self._out += expected
            self._finish()
            events.append(TransportFailed(f"unsupported protocol header {header!r}"))
            return
        if want_sasl:
            self._input = _Input.SASL
            if isinstance(self.config.sasl, SaslServer):
                self._out += SASL_HEADER
                mechanisms = [Symbol(m) for m in self.config.sasl.offered()]
                self._write_sasl(SaslMechanisms(sasl_server_mechanisms=mechanisms))
            return
        self._input = _Input.FRAMES
        self._reader.max_frame_size = self.config.max_frame_size
        if not self._amqp_out:
            self._start_amqp_output()

    def _on_sasl_frame(self, frame: Frame, events: list[Event]) -> None:
        perf = frame.performative
        sasl = self.config.sasl
        if frame.type != FRAME_SASL or perf is None:
            raise RemoteProtocolError(errors.FRAMING_ERROR, "expected a SASL frame")
        if isinstance(sasl, SaslServer) and isinstance(perf, SaslInit):
            outcome, identity = sasl.judge(perf)
            self._write_sasl(outcome)
            events.append(SaslDone(str(perf.mechanism), outcome.code, identity))
            if outcome.code == SASL_OK:
                self.sasl_identity = identity
                self._input = _Input.AMQP_HEADER
            else:
                self._finish()
            return
        if isinstance(sasl, SaslClient):
            if isinstance(perf, SaslMechanisms):
                try:
                    self._write_sasl(sasl.start([str(m) for m in perf.sasl_server_mechanisms]))
                except SaslFailed as exc:
                    self._finish()
                    events.append(TransportFailed(str(exc)))
                return
            if isinstance(perf, SaslChallenge):
                self._write_sasl(sasl.challenge(perf.challenge))
                return
            if isinstance(perf, SaslOutcome):
                events.append(SaslDone(sasl.mechanism, perf.code))
                if perf.code == SASL_OK:
                    self._input = _Input.AMQP_HEADER
                    self._start_amqp_output()
                else:
                    self._finish()
                return
        raise RemoteProtocolError(
            errors.ILLEGAL_STATE, f"unexpected {type(perf).__name__} during SASL"
        )

    def _on_frame(self, frame: Frame, events: list[Event]) -> None:
        perf = frame.performative
        if perf is None:
            return  # heartbeat: counted in _rx_frames, nothing else to do
        if frame.type != FRAME_AMQP:
            raise RemoteProtocolError(errors.FRAMING_ERROR, "SASL frame after SASL")
        kind = type(perf)
        if kind is Transfer:  # the hot path first
            self._on_transfer(frame.channel, perf, frame.payload, events)
            return
        if self.remote_open is None:
            if kind is not Open:
                raise RemoteProtocolError(errors.ILLEGAL_STATE, f"{kind.__name__} before open")
            self._on_open(perf, events)
            return
        if self._close_received:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, f"{kind.__name__} after close")
        handler = _DISPATCH.get(kind)
        if handler is None:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, f"unexpected {kind.__name__}")
        handler(self, frame.channel, perf, events)

    def _on_open(self, perf: Open, events: list[Event]) -> None:
        if perf.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise RemoteProtocolError(
                errors.INVALID_FIELD, f"max-frame-size {perf.max_frame_size} is below 512"
            )
        self.remote_open = perf
        if not self._open_sent:  # answer at once: begin/attach replies must follow our open
            self.open()
        self._peer_max_frame = min(perf.max_frame_size, 0xFFFFFFFF)
        if perf.idle_time_out:
            self._remote_idle = perf.idle_time_out / 1000
        events.append(ConnectionOpened(perf))

    def _on_close(self, _channel: int, perf: Close, events: list[Event]) -> None:
        self._close_received = True
        by_peer = not self._close_sent
        if by_peer:
            self.close()
        self._finish()
        events.append(ConnectionClosed(perf.error, by_peer))

    def _on_begin(self, channel: int, perf: Begin, events: list[Event]) -> None:
        self._check_channel(channel)
        if channel in self._remote_sessions:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, f"channel {channel} already begun")
        if perf.remote_channel is not None:
            session = self.sessions.get(perf.remote_channel)
            if session is None or session.state is not SessionState.BEGIN_SENT:
                raise RemoteProtocolError(
                    errors.ILLEGAL_STATE, f"begin answers channel {perf.remote_channel}, unknown"
                )
            by_peer = False
        else:
            session = self._new_session(self._free_channel(), SessionState.BEGIN_RECEIVED)
            by_peer = True
        session.remote_channel = channel
        self._remote_sessions[channel] = session
        session.on_begin(perf)
        if by_peer:
            self._write(session.channel, session.begin_frame())
        events.append(SessionBegun(session, by_peer))

    def _check_channel(self, channel: int) -> None:
        if channel > self.config.channel_max:
            raise RemoteProtocolError(errors.NOT_ALLOWED, f"channel {channel} is above channel-max")

    def _session(self, channel: int) -> Session:
        session = self._remote_sessions.get(channel)
        if session is None:
            raise RemoteProtocolError(errors.NOT_ALLOWED, f"no session on channel {channel}")
        return session

    def _on_end(self, channel: int, perf: End, events: list[Event]) -> None:
        session = self._session(channel)
        by_peer = session.state is not SessionState.END_SENT
        if by_peer:
            self.end(session)
        session.state = SessionState.ENDED
        # links die with their session (§2.6.1): report each, so nothing waits on them
        for link in session.forget_all_links():
            events.append(LinkDetached(link, True, perf.error, by_peer))
        self._dirty_sessions.discard(session)
        del self._remote_sessions[channel]
        self.sessions.pop(session.channel, None)
        events.append(SessionEnded(session, perf.error, by_peer))

    def _on_attach(self, channel: int, perf: Attach, events: list[Event]) -> None:
        session = self._session(channel)
        if perf.handle in session.remote_links:
            raise RemoteProtocolError(errors.HANDLE_IN_USE, f"handle {perf.handle} is in use")
        if perf.handle > session.handle_max:
            raise RemoteProtocolError(errors.NOT_ALLOWED, f"handle {perf.handle} > handle-max")
        our_role = not perf.role
        link = session.names.get((perf.name, our_role))
        if link is not None and link.state is LinkState.DETACH_SENT and link.remote_attach is None:
            # we detached before the peer's answer came: the frames crossed, which is legal;
            # its detach follows and ends the link
            link.remote_attach = perf
            link.remote_handle = perf.handle
            session.remote_links[perf.handle] = link
            return
        if link is not None and link.state is not LinkState.ATTACH_SENT:
            raise RemoteProtocolError(
                errors.ILLEGAL_STATE, f"link {perf.name!r} is already attached"
            )
        if perf.role is ROLE_SENDER and perf.initial_delivery_count is None:
            raise RemoteProtocolError(
                errors.INVALID_FIELD, "a sender's attach lacks initial-delivery-count"
            )
        if link is None:
            link = Link(
                session, perf.name, session.allocate_handle(), our_role, LinkState.ATTACH_RECEIVED
            )
            session.add_link(link)
            requested = True
        else:
            link.state = LinkState.ATTACHED
            requested = False
        link.remote_attach = perf
        link.remote_handle = perf.handle
        session.remote_links[perf.handle] = link
        if perf.initial_delivery_count is not None and link.is_receiver:
            link.delivery_count = perf.initial_delivery_count
        if requested:
            # pause so the user can answer (and grant credit) before a pipelined transfer
            # on this link is read (LP-10); receive_data(b"") resumes
            self.input_paused = True
            events.append(LinkAttachRequested(link))
        else:
            events.append(LinkAttached(link))

    def _on_flow(self, channel: int, perf: Flow, events: list[Event]) -> None:
        session = self._session(channel)
        link = session.on_flow(perf)
        if link is None:
            if perf.echo:
                self._write(session.channel, session.flow_frame())
            return
        if link.state is LinkState.DETACH_SENT:
            return
        if perf.echo:
            self._write(session.channel, session.flow_frame(link))
        events.append(LinkFlow(link))

    def _on_transfer(
        self, channel: int, perf: Transfer, payload: memoryview, events: list[Event]
    ) -> None:
        if self.remote_open is None or self._close_received:
            raise RemoteProtocolError(errors.ILLEGAL_STATE, "transfer outside an open connection")
        session = self._session(channel)
        try:
            link, done = session.on_transfer(perf, payload)
        except LinkError as exc:
            link = session.remote_link(perf.handle)
            self.detach(
                link, closed=True, error=Error(condition=exc.condition, description=exc.description)
            )
            return
        if session.wants_window_refill():
            self._refill.add(session)
        if done is not None:
            events.append(MessageReceived(link, done[0], done[1]))

    def _on_disposition(self, channel: int, perf: Disposition, events: list[Event]) -> None:
        session = self._session(channel)
        for delivery in session.on_disposition(perf):
            events.append(DeliveryUpdated(delivery.link, delivery))

    def _on_detach(self, channel: int, perf: Detach, events: list[Event]) -> None:
        session = self._session(channel)
        link = session.remote_link(perf.handle)
        by_peer = link.state is not LinkState.DETACH_SENT
        if by_peer:
            if link.state is LinkState.ATTACH_RECEIVED:  # never answered: attach, then detach
                self._write(session.channel, self._attach_frame(link, None, None))
            session.flush_dispositions()
            self._write(session.channel, Detach(handle=link.handle, closed=perf.closed))
        session.forget_link(link)
        error = perf.error if by_peer else link.detach_error
        events.append(LinkDetached(link, bool(perf.closed), error, by_peer))

    # -- failure ---------------------------------------------------------------------------

    def _fail(self, condition: str, description: str, events: list[Event]) -> None:
        """Close with ``condition`` at once and stop reading: the peer broke the protocol."""
        events.append(ProtocolViolation(condition, description))
        if not self._close_sent and self._amqp_out:
            if not self._open_sent:
                self.open()
            self._close_sent = True
            self._write(0, Close(error=Error(condition=condition, description=description)))
        # before our AMQP header (a broken SASL exchange) no close can be said: just hang up
        self._finish()


_DISPATCH: dict[type, Any] = {
    Close: Connection._on_close,
    Begin: Connection._on_begin,
    End: Connection._on_end,
    Attach: Connection._on_attach,
    Flow: Connection._on_flow,
    Disposition: Connection._on_disposition,
    Detach: Connection._on_detach,
}
