"""Exceptions users of pairlink see, each carrying the AMQP condition that caused it.

The sans-IO engine reports trouble as events; the Trio layer turns the ones that end an
operation into these exceptions, raised in the task that waited for that operation.
"""

from __future__ import annotations

from typing import Self

from framework.amqp.messaging import Error


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


class RemoteError(PairlinkError):
    """A call failed on the service's side: ``status`` is the reply's status-code (400, 404,
    408, 500, 503), ``type`` the exception type the handler raised (if one did)."""

    def __init__(self, status: int, message: str, type: str | None = None) -> None:
        label = f"{type}: {message}" if type else message
        super().__init__(f"[{status}] {label}")
        self.status = status
        self.type = type
        self.message = message


class RemoteTimeoutError(RemoteError, TimeoutError):
    """The service answered 408: the call's deadline passed before it could run. It is a
    ``TimeoutError`` too, so one ``except TimeoutError`` catches a deadline missed on either
    side (the service's answer can beat the caller's own timer by a hair)."""
