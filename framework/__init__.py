"""pairlink: Trio actors serving request-response over AMQP 1.0 paired links.

The public API, re-exported here. The layers below it, each a subpackage importing only those
under it (the contracts in pyproject.toml, checked by ``make lint``):

* ``framework.amqp``: the sans-IO AMQP 1.0 engine (codec, frames, SASL, sessions, links);
* ``framework.io``: the Trio layer (a connection's loops, the link API, URLs, connect, listen);
* ``framework.rpc``: the conventions of a call (wire format, payloads, link pairing, deadlines);
* ``framework.client`` and ``framework.server``: calling services, and declaring and serving them;
* ``framework.gateway``: relaying paired links between organisations;
* ``framework.spark`` (imported by nothing else: it loads pyspark) and ``framework.cli``.
"""

from framework.client import Client, Reply, ServiceProxy, connect
from framework.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    MessageTooLargeError,
    PairlinkError,
    RemoteError,
)
from framework.rpc.tracing import TraceContext, current_trace, use_trace
from framework.rpc.wire import CallError
from framework.server import handler, hosted, open_server, remote, serve, service
from framework.server.context import CallContext, Middleware, Proceed, current_call

__all__ = [
    "AuthenticationError",
    "CallContext",
    "CallError",
    "Client",
    "ConnectionLostError",
    "LinkDetachedError",
    "MessageTooLargeError",
    "Middleware",
    "PairlinkError",
    "Proceed",
    "RemoteError",
    "Reply",
    "ServiceProxy",
    "TraceContext",
    "connect",
    "current_call",
    "current_trace",
    "handler",
    "hosted",
    "open_server",
    "remote",
    "serve",
    "service",
    "use_trace",
]
