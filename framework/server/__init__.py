"""Serving: ``@service`` declarations, the actor that runs a service's calls, the container
that routes requests and replies over paired links, deduplication, and ``open_server``."""

from framework.server.service import handler, hosted, service
from framework.server.serving import open_server, remote, serve

__all__ = ["handler", "hosted", "open_server", "remote", "serve", "service"]
