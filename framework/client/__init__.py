"""Calling services: the Trio client (pairs of links, correlation, retries), its timeouts, and
a blocking facade for code without an event loop."""

from framework.client.client import Client, ServiceProxy, connect

__all__ = ["Client", "ServiceProxy", "connect"]
