"""Protocol errors of the sans-IO engine and the AMQP error condition symbols.

h11-style split: a ``LocalProtocolError`` means *our* user asked for something the protocol
forbids (a bug on this side, raised straight to the caller); a ``RemoteProtocolError`` means the
peer sent something illegal (the engine closes the connection with ``condition`` and reports it
as an event, it never escapes ``receive_data``). This module is a leaf: it imports nothing of the
project, so every other module may use it. Conditions are plain ``str`` here: the ``error``
composite's ``condition`` field is typed ``symbol``, so they go out as symbols, and a decoded
``Symbol`` (a ``str`` subclass) compares equal to them.
"""

from __future__ import annotations

# amqp-error (transport.xml "definitions")
INTERNAL_ERROR = "amqp:internal-error"
NOT_FOUND = "amqp:not-found"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
DECODE_ERROR = "amqp:decode-error"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
NOT_ALLOWED = "amqp:not-allowed"
INVALID_FIELD = "amqp:invalid-field"
NOT_IMPLEMENTED = "amqp:not-implemented"
RESOURCE_LOCKED = "amqp:resource-locked"
PRECONDITION_FAILED = "amqp:precondition-failed"
RESOURCE_DELETED = "amqp:resource-deleted"
ILLEGAL_STATE = "amqp:illegal-state"
FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
# connection-error
CONNECTION_FORCED = "amqp:connection:forced"
FRAMING_ERROR = "amqp:connection:framing-error"
CONNECTION_REDIRECT = "amqp:connection:redirect"
# session-error
WINDOW_VIOLATION = "amqp:session:window-violation"
ERRANT_LINK = "amqp:session:errant-link"
HANDLE_IN_USE = "amqp:session:handle-in-use"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"
# link-error
DETACH_FORCED = "amqp:link:detach-forced"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
LINK_REDIRECT = "amqp:link:redirect"
STOLEN = "amqp:link:stolen"


class ProtocolError(Exception):
    """A breach of the AMQP 1.0 rules, carrying the error condition that names it on the wire."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class LocalProtocolError(ProtocolError):
    """Our own user asked the engine for something the protocol (or the engine's state) forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; the engine answers by closing with ``condition``."""


class DecodeError(RemoteProtocolError):
    """Bytes that are not a legal AMQP encoding, or not of the type their field needs
    (``amqp:decode-error``), or a legal value the field does not allow (``condition``
    ``amqp:invalid-field``). Everything decoding rejects is one of these, so one ``except``
    covers a frame and a message alike."""

    def __init__(self, description: str, condition: str = DECODE_ERROR) -> None:
        super().__init__(condition, description)
