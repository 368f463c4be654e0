"""Calling services: the Trio client (pairs of links, correlation, retries), its timeouts, and
a blocking facade for code without an event loop."""

from framework.client.client import Client, ServiceProxy, connect
from framework.client.reply import Reply

__all__ = ["Client", "Reply", "ServiceProxy", "connect"]
