"""Calling services: the Trio client (pairs of links, correlation, retries), its timeouts, and
a blocking facade for code without an event loop (public in :mod:`pairlink.client` and
:mod:`pairlink.blocking`)."""
