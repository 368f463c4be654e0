"""Serving: ``@service`` declarations, the actor that runs a service's calls, the container
that routes requests and replies over paired links, deduplication, and ``open_server``."""
