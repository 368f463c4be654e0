"""What the engine tells its user, kept apart from the wire frames.

The engine turns frames into these events so that its user never has to know which performative
carried what: a multi-frame message arrives as one ``MessageReceived``; a detach answered by the
engine itself still shows up as ``LinkDetached``. Links, sessions and deliveries are the engine's
own state objects; events only point at them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .link import Delivery, Link
    from .messaging import Error
    from .performatives import Open
    from .session import Session


class Event:
    """Base class of everything ``Connection.receive_data`` and friends return."""

    __slots__ = ()


@attrs.define(slots=True)
class SaslDone(Event):
    """The SASL layer finished: ``outcome`` 0 is ok, anything else is a refusal. On the
    server side ``identity`` is who the peer authenticated as, or, on a refused login, the
    user it claimed to be (never a password); ``mechanism`` None: the peer skipped SASL (the
    plain AMQP header) on a server that lets anonymous peers in, and is anonymous."""

    mechanism: str | None
    outcome: int
    identity: str | None = None


@attrs.define(slots=True)
class ConnectionOpened(Event):
    """The peer's open arrived; its negotiated values are on the connection too."""

    open: Open


@attrs.define(slots=True)
class ConnectionClosed(Event):
    """The connection is over: the peer closed it (``by_peer``) or we did and it answered."""

    error: Error | None
    by_peer: bool


@attrs.define(slots=True)
class ProtocolViolation(Event):
    """The peer broke the protocol; the engine has queued a close carrying ``condition``.

    With ``cause`` (and ``amqp:internal-error``) it was our own fault handling the input: the
    exception, for the log's traceback; the peer was told no more than the condition."""

    condition: str
    description: str
    cause: BaseException | None = None


@attrs.define(slots=True)
class TransportFailed(Event):
    """The byte stream died (lost socket, idle timeout) before a clean close."""

    reason: str


@attrs.define(slots=True)
class SessionBegun(Event):
    """A session is mapped both ways; ``by_peer`` when the peer initiated it."""

    session: Session
    by_peer: bool


@attrs.define(slots=True)
class SessionEnded(Event):
    """A session ended; every link on it is gone too."""

    session: Session
    error: Error | None
    by_peer: bool


@attrs.define(slots=True)
class LinkAttachRequested(Event):
    """The peer attached a link we did not ask for: answer it or refuse it."""

    link: Link


@attrs.define(slots=True)
class LinkAttached(Event):
    """The peer answered our attach; the remote terminus may be null (a refusal follows)."""

    link: Link


@attrs.define(slots=True)
class LinkFlow(Event):
    """Flow state of a link changed (new credit, drain, echo request)."""

    link: Link


@attrs.define(slots=True)
class MessageReceived(Event):
    """A whole delivery arrived (all its frames); ``payload`` is the encoded message."""

    link: Link
    delivery: Delivery
    payload: bytes


@attrs.define(slots=True)
class DeliveryUpdated(Event):
    """The peer changed the state or settlement of one of our deliveries."""

    link: Link
    delivery: Delivery


@attrs.define(slots=True)
class LinkDetached(Event):
    """A link is detached (``closed`` when for good); ``by_peer`` if the peer started it."""

    link: Link
    closed: bool
    error: Error | None
    by_peer: bool
