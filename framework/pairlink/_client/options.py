"""What ``connect`` takes and what a proxy's calls take, apart from the client itself: the
keyword sets the helpers that connect for their caller pass on, and a proxy's call options."""

from __future__ import annotations

import ssl

import attrs

from pairlink._io import net
from pairlink._io.net import ClientConfig
from pairlink._rpc.payload import Encoding


@attrs.frozen
class CallOptions:
    """A proxy's options for its calls, kept apart from the operation's keyword arguments
    (an operation may well have a parameter named ``timeout``). None: the client's."""

    timeout: float | None = None
    """Seconds (``math.inf``: none), as ``Client.call``'s ``timeout``."""
    encoding: Encoding | None = None
    message_id: str | None = None
    """The same id for each call: a repeated call that a deduplicating service recognises."""

    def evolve(
        self,
        timeout: float | None,
        encoding: Encoding | None,
        message_id: str | None,
    ) -> CallOptions:
        """These options with the ones given (not None) replaced."""
        return CallOptions(
            timeout=self.timeout if timeout is None else timeout,
            encoding=self.encoding if encoding is None else encoding,
            message_id=self.message_id if message_id is None else message_id,
        )


class ConnectConfig(ClientConfig, total=False):
    """``connect``'s ``**config``: the connection's settings, handed to
    :func:`pairlink._io.net.connect` as given (defaults there and in ``client_config``)."""

    max_outgoing_bytes: int


class _ClientSettings(ConnectConfig, total=False):
    """``connect``'s keywords but its stream (``connector``) and its timeouts: the part
    of them every helper that connects for its caller passes on."""

    settled: bool
    reconnect: bool
    encoding: Encoding | None
    reply_credit: int
    retry_delay: float
    max_retry_delay: float
    ssl_context: ssl.SSLContext | None
    resolve_interval: float


class ConnectOptionsExceptTimeouts(_ClientSettings, total=False):
    """``connect``'s keywords but ``timeout`` and ``connect_timeout``, for a helper that sets
    both (``check_health``)."""

    connector: net.Connector | None


class ConnectOptionsExceptConnector(_ClientSettings, total=False):
    """``connect``'s keywords but ``connector``, for a helper that gives the stream itself
    (the in-memory client of :mod:`pairlink.testing`)."""

    timeout: float | None
    connect_timeout: float | None


class ConnectOptions(ConnectOptionsExceptTimeouts, ConnectOptionsExceptConnector, total=False):
    """Every keyword of ``connect``: what the blocking client takes."""
