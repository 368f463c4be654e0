"""The exceptions of pairlink, in one public module: the ones callers catch (each carrying the
AMQP condition that caused it when there is one), and ``CallError``, which a handler raises to
answer with a status of its own choosing.

The sans-IO engine reports trouble as events; the Trio layer turns the ones that end an
operation into these exceptions, raised in the task that waited for that operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from pairlink._amqp.messaging import Error

__all__ = [
    "AuthenticationError",
    "CallError",
    "ConfigError",
    "ConnectionLostError",
    "LinkDetachedError",
    "MessageTooLargeError",
    "MetricsUnavailable",
    "PairlinkError",
    "PayloadError",
    "RemoteError",
    "RemoteTimeoutError",
]


class PairlinkError(Exception):
    """Base of every pairlink error; ``condition`` is the AMQP error symbol when there is one."""

    def __init__(self, description: str, condition: str | None = None) -> None:
        super().__init__(f"{condition}: {description}" if condition else description)
        self.condition = condition
        self.description = description

    @classmethod
    def from_amqp(cls, error: Error | None, default: str) -> Self:
        """Build from the ``error`` field of a close, end or detach (which may be absent)."""
        if error is None:
            return cls(default)
        return cls(error.description or default, str(error.condition))


class ConnectionLostError(PairlinkError, ConnectionError):
    """The connection is gone: the peer closed it, it failed, or it timed out."""


class AuthenticationError(ConnectionLostError):
    """The SASL exchange failed (wrong credentials, no common mechanism)."""


class LinkDetachedError(PairlinkError):
    """The link was detached (the peer refused it or closed it), possibly with an error."""


class MessageTooLargeError(PairlinkError, ValueError):
    """A message is larger than the peer accepts (the max-message-size of its attach)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the message is {size:,} bytes; the peer accepts at most {limit:,} (its "
            "max-message-size)",
            "amqp:link:message-size-exceeded",
        )
        self.size = size
        self.limit = limit


class RemoteError(PairlinkError):
    """A call failed on the service's side: ``status`` is the reply's status-code (400, 404,
    408, 500, 503), ``type`` the exception type the handler raised, when the service chose
    to tell it (a ``CallError``, a declared type, debug mode). ``ref`` is the reference id
    under which the service logged an unexpected failure: quote it to the service's owners,
    who find the traceback beside it in their log."""

    def __init__(
        self, status: int, message: str, type: str | None = None, ref: str | None = None
    ) -> None:
        label = f"{type}: {message}" if type else message
        super().__init__(f"[{status}] {label}")
        self.status = status
        self.type = type
        self.message = message
        self.ref = ref


class RemoteTimeoutError(RemoteError, TimeoutError):
    """The service answered 408: the call's deadline passed before it could run. It is a
    ``TimeoutError`` too, so one ``except TimeoutError`` catches a deadline missed on either
    side (the service's answer can beat the caller's own timer by a hair)."""


class CallError(Exception):
    """Raised on the service side to answer a request with ``status`` instead of a value:
    the status, description and ``error_type`` reach the caller as given (unlike the text of
    an unexpected exception, which the service keeps to its log)."""

    def __init__(self, status: int, description: str, error_type: str | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.error_type = error_type


class PayloadError(ValueError):
    """A body that cannot be decoded as its content type says (a 400 for the caller)."""


class ConfigError(ValueError):
    """The configuration is malformed: the message names the file, line and key."""


class MetricsUnavailable(PairlinkError):
    """Metrics were asked for, but ``prometheus_client`` is not installed."""
