"""A plain (not TLS) socket read and written directly, beside Trio's stream over it: the
sequential call's fast path of :class:`pairlink._io.connection.AmqpConnection`.

Trio's ``SocketStream.receive_some`` tries ``recv`` first and waits for the socket to become
readable only once that fails. A connection that has just answered a lone call has nothing to
read yet (its peer waits for that answer), so every sequential call paid a failed ``recv`` and
Trio's wrappers around both attempts: ``receive`` waits first and then reads once, four system
calls a call in all (``epoll_ctl``, ``epoll_wait``, ``read``, ``write``). Waiting first costs
nothing when bytes are already there: ``wait_readable`` returns after one pass of the run loop,
the pass that ``receive_some`` would give the other tasks anyway.

Errors mean what they mean on Trio's stream: ``trio.ClosedResourceError`` once the socket is
closed, ``trio.BrokenResourceError`` when the connection broke. ``write_nowait`` raises
nothing: a socket that takes nothing now, or is broken, leaves the bytes to the connection's
writer, whose ``send_all`` waits, or says what went wrong.
"""

from __future__ import annotations

import errno
import os

import trio


async def receive(sock: trio.socket.SocketType, size: int) -> bytes:
    """Wait until ``sock`` is readable, then read at most ``size`` bytes (b"": the peer's EOF).
    Always a checkpoint, as ``receive_some`` is."""
    while True:
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            await trio.lowlevel.wait_readable(fd)  # closed while waiting: ClosedResourceError
            return os.read(sock.fileno(), size)  # closed since the wake-up: fileno -1, EBADF
        except BlockingIOError:
            continue  # readable was a false alarm: wait again
        except OSError as exc:
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("the socket was closed") from None
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


def write_nowait(sock: trio.socket.SocketType, data: bytes) -> int:
    """Write what ``sock`` takes of ``data`` now, without waiting: how many bytes it took."""
    try:
        return os.write(sock.fileno(), data)  # closed: fileno -1, EBADF
    except OSError:  # full (BlockingIOError) or broken: the writer's send_all says which
        return 0
