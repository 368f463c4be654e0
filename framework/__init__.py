"""pairlink: Trio actors serving request-response over AMQP 1.0 paired links.

The public API, re-exported here. The decorator ``service`` shares its name with the module
``framework.service``, so it is imported eagerly: binding it after the submodule has loaded is
what makes ``from framework import service`` always give the decorator. Nothing here imports
pyspark (``framework.spark`` does, lazily).
"""

from framework.client import Client, ServiceProxy, connect
from framework.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    MessageTooLargeError,
    PairlinkError,
    RemoteError,
)
from framework.service import handler, hosted, open_server, remote, serve, service
from framework.wire import CallError

__all__ = [
    "AuthenticationError",
    "CallError",
    "Client",
    "ConnectionLostError",
    "LinkDetachedError",
    "MessageTooLargeError",
    "PairlinkError",
    "RemoteError",
    "ServiceProxy",
    "connect",
    "handler",
    "hosted",
    "open_server",
    "remote",
    "serve",
    "service",
]
