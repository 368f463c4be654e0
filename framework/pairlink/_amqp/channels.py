"""A connection's sessions by channel (Part 2 §2.5.1, §2.7.1), and what the session and link
performatives the peer sends on those channels do.

A session has a channel of ours, which our frames for it carry, and one of the peer's, which
its frames carry. ``Connection`` keeps the connection-level frames (open, close) and the input
loop, and hands begin, end, attach, flow, transfer, disposition and detach to ``Channels``:
each finds its session, lets the session and its links judge the performative (session.py,
link.py) and turns the outcome into events and answers. What the sessions owe the peer across
frames is kept here too: dispositions still to write, and windows to refill once per batch of
input.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeAlias

from . import errors
from .config import ConnectionConfig
from .errors import RemoteProtocolError
from .events import (
    DeliveryUpdated,
    Event,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    SessionBegun,
    SessionEnded,
)
from .link import IncomingBytes, Link, LinkError, LinkSession, LinkState
from .messaging import Error
from .performatives import Attach, Begin, Detach, Disposition, End, Flow, Performative, Transfer
from .session import Session, SessionState


class WriteOnChannel(Protocol):
    """The connection's frame writer: ``performative`` (and ``payload``) on ``channel``."""

    def __call__(
        self, channel: int, performative: Performative, payload: bytes | memoryview = b""
    ) -> None: ...


class DetachLink(Protocol):
    """``Connection.detach``: the detach of a link of ours, refusing it if still unanswered."""

    def __call__(self, link: Link, *, closed: bool = True, error: Error | None = None) -> None: ...


class Channels:
    """The sessions of one connection: ours by our channel, the peer's by its channel.

    ``write`` puts a frame out, ``detach`` detaches a link the way ``Connection.detach`` does,
    ``pause`` stops the connection's reading until the user has answered an attach."""

    def __init__(
        self,
        config: ConnectionConfig,
        incoming: IncomingBytes,
        write: WriteOnChannel,
        detach: DetachLink,
        pause: Callable[[], None],
    ) -> None:
        self.sessions: dict[int, Session] = {}  # by our channel
        self._remote_sessions: dict[int, Session] = {}  # by the peer's channel
        self.peer_channel_max: int | None = None  # from the peer's open
        self.dirty: set[LinkSession] = set()  # sessions with queued dispositions
        self.refill: set[Session] = set()  # sessions whose incoming window runs low
        self.batch = 0  # counts the inputs whose events are reported together (Connection._read)
        self._config = config
        self._incoming = incoming
        self._write = write
        self._detach = detach
        self._pause = pause

    # -- our side --------------------------------------------------------------------------

    def new(self, channel: int, state: SessionState) -> Session:
        session = Session(
            channel,
            partial(self._write, channel),  # (a session keeps its channel: no closure frame)
            state,
            incoming_window_size=self._config.session_window,
            handle_max=self._config.handle_max,
            max_unsettled=self._config.max_session_unsettled,
            incoming=self._incoming,
        )
        self.sessions[channel] = session
        return session

    def limit(self) -> int:
        """The highest channel of ours: within our channel-max and the peer's (§2.7.1)."""
        limit = self._config.channel_max
        if self.peer_channel_max is not None:
            limit = min(limit, self.peer_channel_max)
        return limit

    def free(self) -> int | None:
        """The lowest channel free for a session of ours, None if every one is taken."""
        for channel in range(self.limit() + 1):
            if channel not in self.sessions:
                return channel
        return None

    def end(self, session: Session, error: Error | None = None) -> None:
        if session.state in (SessionState.END_SENT, SessionState.ENDED):
            return
        session.flush_dispositions()
        self.dirty.discard(session)
        session.state = SessionState.END_SENT
        self._write(session.channel, End(error=error))

    def flush_dispositions(self) -> None:
        for session in self.dirty:
            session.flush_dispositions()
            flow = session.reopen_window()  # settling the peer's deliveries made room
            if flow is not None:
                self._write(session.channel, flow)
        self.dirty.clear()

    def write_refills(self) -> None:
        """Refill the windows that ran low: once per batch of input, not per frame (the peer
        learns of the new window only from this flow, so frames beyond the old one stay
        violations)."""
        for session in self.refill:
            if session.state is SessionState.MAPPED:
                self._write(session.channel, session.flow_frame())
        self.refill.clear()

    # -- the peer's performatives ----------------------------------------------------------

    def on_begin(self, channel: int, perf: Begin, events: list[Event]) -> None:
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
            ours = self.free()
            if ours is None:  # channel-max + 1 is the most sessions either side may have
                raise RemoteProtocolError(
                    errors.NOT_ALLOWED,
                    f"begin on channel {channel}: more sessions than channel-max "
                    f"{self.limit()} allows",
                )
            session = self.new(ours, SessionState.BEGIN_RECEIVED)
            by_peer = True
        session.remote_channel = channel
        self._remote_sessions[channel] = session
        session.on_begin(perf)
        if by_peer:
            self._write(session.channel, session.begin_frame())
        events.append(SessionBegun(session, by_peer))

    def _check_channel(self, channel: int) -> None:
        if channel > self._config.channel_max:  # §2.7.1: a framing error
            raise RemoteProtocolError(
                errors.FRAMING_ERROR,
                f"channel {channel} is above our channel-max {self._config.channel_max}",
            )

    def _session(self, channel: int) -> Session:
        session = self._remote_sessions.get(channel)
        if session is None:
            raise RemoteProtocolError(errors.NOT_ALLOWED, f"no session on channel {channel}")
        return session

    def on_end(self, channel: int, perf: End, events: list[Event]) -> None:
        session = self._session(channel)
        by_peer = session.state is not SessionState.END_SENT
        if by_peer:
            self.end(session)
        session.state = SessionState.ENDED
        # links die with their session (§2.6.1): report each, so nothing waits on them
        for link in session.forget_all_links():
            events.append(LinkDetached(link, True, perf.error, by_peer))
        self.dirty.discard(session)
        del self._remote_sessions[channel]
        self.sessions.pop(session.channel, None)
        events.append(SessionEnded(session, perf.error, by_peer))

    def on_attach(self, channel: int, perf: Attach, events: list[Event]) -> None:
        answered = self._session(channel).on_attach(perf, self._config.max_unsettled)
        if answered is None:
            return
        link, requested = answered
        limit = self._config.max_links
        if requested and sum(len(s.links) for s in self.sessions.values()) > limit:
            # refused here, never offered to the user: a null terminus, then the detach
            why = f"more than {limit} links on one connection"
            self._detach(link, closed=True, error=Error(errors.RESOURCE_LIMIT_EXCEEDED, why))
            return
        if requested:
            # pause so the user can answer (and grant credit) before a pipelined transfer
            # on this link is read (LP-10); resume_input() goes on
            self._pause()
            events.append(LinkAttachRequested(link))
        else:
            events.append(LinkAttached(link))

    def on_flow(self, channel: int, perf: Flow, events: list[Event]) -> None:
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

    def on_transfer(
        self, channel: int, perf: Transfer, payload: memoryview, events: list[Event]
    ) -> None:
        session = self._remote_sessions.get(channel) or self._session(channel)
        try:
            link, done = session.on_transfer(perf, payload)
        except LinkError as exc:
            link = session.remote_link(perf.handle)
            self._detach(
                link, closed=True, error=Error(condition=exc.condition, description=exc.description)
            )
            return
        if session.wants_window_refill():
            self.refill.add(session)
        if done is not None:
            link.reported_in = self.batch  # its later messages of this batch follow this one
            events.append(MessageReceived(link, done[0], done[1]))

    def pass_through(self, channel: int, handle: int, delivery_id: int, payload: bytearray) -> bool:
        """A whole pre-settled message in one frame: passed through by its link's ``forward``
        (``Session.pass_through``), or False for ``on_transfer`` to judge the frame."""
        session = self._remote_sessions.get(channel)
        if session is None or not session.pass_through(handle, delivery_id, payload, self.batch):
            return False
        if session.wants_window_refill():
            self.refill.add(session)
        return True

    def on_disposition(self, channel: int, perf: Disposition, events: list[Event]) -> None:
        session = self._session(channel)
        for delivery in session.on_disposition(perf):
            events.append(DeliveryUpdated(delivery.link, delivery))
        for link in session.wake_starved():  # room under the session's bound: send again
            events.append(LinkFlow(link))

    def on_detach(self, channel: int, perf: Detach, events: list[Event]) -> None:
        session = self._session(channel)
        link = session.remote_link(perf.handle)
        by_peer = link.state is not LinkState.DETACH_SENT
        if by_peer:
            if link.state is LinkState.ATTACH_RECEIVED:  # never answered: attach, then detach
                self._write(session.channel, link.attach_frame(None, None))
            session.flush_dispositions()
            self._write(session.channel, Detach(handle=link.handle, closed=perf.closed))
        session.forget_link(link)
        error = perf.error if by_peer else link.detach_error
        events.append(LinkDetached(link, bool(perf.closed), error, by_peer))


Handler: TypeAlias = Callable[[Channels, int, Any, list[Event]], None]
"""A ``Channels`` method taking the performative of its key's type: a table cannot tie the
performative's type to its key, so here it is ``Any`` (each method's own signature is exact)."""

DISPATCH: dict[type, Handler] = {
    Begin: Channels.on_begin,
    End: Channels.on_end,
    Attach: Channels.on_attach,
    Flow: Channels.on_flow,
    Disposition: Channels.on_disposition,
    Detach: Channels.on_detach,
}
"""The session and link performatives ``Channels`` handles, but for transfer (``on_transfer``
takes the payload too, and the connection calls it first: the hot path)."""
