"""What a connection announces in its open and the limits it holds the peer to.

Every bound on what a peer can make the engine hold or do is a field here, with its default a
documented module constant next to the code that enforces it (``link.MAX_UNSETTLED``...), so a
service or a gateway configures them in one place and the engine reads them from one object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from .codec import MAX_ELEMENTS
from .link import MAX_INCOMPLETE_BYTES, MAX_UNSETTLED
from .sasl import SaslClient, SaslServer
from .session import HANDLE_MAX, MAX_SESSION_UNSETTLED

if TYPE_CHECKING:
    from .types import Fields

MAX_MESSAGE_SIZE = 64 * 2**20
"""The largest incoming message we reassemble (64 MiB), announced on every attach of ours: a
larger one has its link detached with ``amqp:link:message-size-exceeded``."""

MAX_LINKS = 8192
"""Links a peer may have attached on one connection at once, over all its sessions (the
channel-max and handle-max alone would allow 261,888, some 8 KiB each): past it the engine
refuses a new one itself (null terminus, ``amqp:resource-limit-exceeded``). Four thousand
pairs per connection; a gateway carrying more opens more connections upstream."""

MIN_PEER_IDLE_TIMEOUT = 0.1
"""Shortest idle timeout we let a peer ask of us, in seconds (its open's idle-time-out): we
heartbeat at half of it, so one field must not set us writing thousands of frames a second;
below it we close with ``amqp:invalid-field``, as §2.4.5 lets a peer do."""


@attrs.define
class ConnectionConfig:
    """What we announce in our open and the limits we hold the peer to."""

    container_id: str
    hostname: str | None = None
    max_frame_size: int = 65536
    channel_max: int = 255
    idle_timeout: float | None = None  # seconds of silence after which the peer is dead
    offered_capabilities: Sequence[str] = ()
    desired_capabilities: Sequence[str] = ()
    properties: Fields | None = None
    max_message_size: int = MAX_MESSAGE_SIZE  # the largest incoming message we reassemble
    session_window: int = 65536  # incoming window of our sessions, in transfer frames
    sasl: SaslClient | SaslServer | None = None
    handle_max: int = HANDLE_MAX  # highest link handle per session (session.HANDLE_MAX)
    max_incomplete_bytes: int = MAX_INCOMPLETE_BYTES  # partial messages held, all links
    max_unsettled: int = MAX_UNSETTLED  # unsettled deliveries per link, each direction
    max_session_unsettled: int = MAX_SESSION_UNSETTLED  # the same per session, all its links
    max_links: int = MAX_LINKS  # links attached at once on a connection, all sessions
    max_decoded_elements: int = MAX_ELEMENTS  # values one frame may decode into (codec.py)
    min_peer_idle_timeout: float = MIN_PEER_IDLE_TIMEOUT  # shortest idle-time-out we accept
