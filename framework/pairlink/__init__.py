"""pairlink: Trio actors serving request-response over AMQP 1.0 paired links.

The names a service author and a caller need, re-exported here. The rest of the public API
lives in a few public modules: :mod:`pairlink.client` (the Trio client and raw messages),
:mod:`pairlink.blocking` (the same client for code without an event loop),
:mod:`pairlink.gateway`, :mod:`pairlink.spark` (imports pyspark when its functions run),
:mod:`pairlink.testing` and :mod:`pairlink.errors`. Everything under an underscored name is
private: it may change in any release.

The private layers, each a subpackage importing only those under it (the contracts in
pyproject.toml, checked by ``make lint``):

* ``pairlink._amqp``: the sans-IO AMQP 1.0 engine (codec, frames, SASL, sessions, links);
* ``pairlink._io``: the Trio layer (a connection's loops, the link API, URLs, connect, listen);
* ``pairlink._rpc``: the conventions of a call (wire format, payloads, link pairing, deadlines);
* ``pairlink._client`` and ``pairlink._server``: calling services, declaring and serving them;
* ``pairlink._gateway``: relaying paired links between organisations;
* ``pairlink._spark`` (imported only by :mod:`pairlink.spark`) and ``pairlink._cli``.
"""

from pairlink._client.client import Client, connect
from pairlink._client.proxy import ServiceProxy
from pairlink._client.reply import Reply
from pairlink._config.limits import Limits
from pairlink._rpc.tracing import TraceContext, current_trace, use_trace
from pairlink._server.context import CallContext, Middleware, Proceed, current_call, in_call
from pairlink._server.service import handler, hosted, service
from pairlink._server.serving import Server, open_server, remote, serve
from pairlink._version import VERSION
from pairlink.errors import (
    AuthenticationError,
    CallError,
    ConfigError,
    ConnectionLostError,
    LinkDetachedError,
    MessageTooLargeError,
    PairlinkError,
    PayloadError,
    RemoteError,
    RemoteTimeoutError,
)

__version__ = VERSION

__all__ = [
    "AuthenticationError",
    "CallContext",
    "CallError",
    "Client",
    "ConfigError",
    "ConnectionLostError",
    "Limits",
    "LinkDetachedError",
    "MessageTooLargeError",
    "Middleware",
    "PairlinkError",
    "PayloadError",
    "Proceed",
    "RemoteError",
    "RemoteTimeoutError",
    "Reply",
    "Server",
    "ServiceProxy",
    "TraceContext",
    "__version__",
    "connect",
    "current_call",
    "current_trace",
    "handler",
    "hosted",
    "in_call",
    "open_server",
    "remote",
    "serve",
    "service",
    "use_trace",
]
