"""Helpers for testing services: call them through the real container, engine and client over
in-memory streams, no sockets, in a Trio test.

``serve_in_memory(Calculator)`` is a client of a server that serves ``Calculator`` and opens
no socket: each of the client's connections (a reconnect too) is a new in-memory stream pair
whose other end the server's listener serves like an accepted socket (the same handshake,
SASL ANONYMOUS, limits and container). With no real I/O, Trio's ``autojump_clock`` drives
timeouts and deadlines in no time (deadlines travel as wall-clock times: have
:func:`wall_clock` read the mock clock:
``with wall_clock(lambda: clock.current_time() + 1.7e9):``).

For more than one client, or to reach the server itself, open it with
``open_server(..., listen=None)`` and connect each client with :func:`connect_in_memory`.
"""

from pairlink._rpc.deadline import wall_clock
from pairlink._testing import connect_in_memory, serve_in_memory

__all__ = ["connect_in_memory", "serve_in_memory", "wall_clock"]
