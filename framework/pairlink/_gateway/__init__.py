"""The gateway behind :mod:`pairlink.gateway`: its config, routing, pairs and upstreams."""
