"""What a connection tells the ends of its links: the engine's link events, handed to the end
a link's owner set as its ``user_data`` (the link API's :class:`pairlink._io.links.LinkEnd`,
which passes them on to that owner). A link no owner took yet has none, and hears nothing.

Each function takes the connection and the event, as
:class:`pairlink._io.connection.AmqpConnection`'s dispatch table calls them.
"""

from __future__ import annotations

from typing import Any, Protocol

from pairlink._amqp.events import (
    DeliveryUpdated,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    MessageReceived,
)
from pairlink._amqp.link import Delivery
from pairlink.errors import LinkDetachedError


class LinkEvents(Protocol):
    """The end of one link (``link.user_data``)."""

    def on_attached(self) -> None: ...
    def on_flow(self) -> None: ...
    def on_message(self, delivery: Delivery, payload: bytes) -> None: ...
    def on_update(self, delivery: Delivery) -> None: ...
    def on_ended(self, detached: LinkDetachedError | None = None) -> None: ...


def attached(_conn: Any, event: LinkAttached) -> None:
    end: LinkEvents | None = event.link.user_data
    if end is not None:
        end.on_attached()


def flowed(_conn: Any, event: LinkFlow) -> None:
    end: LinkEvents | None = event.link.user_data
    if end is not None:
        end.on_flow()


def received(_conn: Any, event: MessageReceived) -> None:
    end: LinkEvents | None = event.link.user_data
    if end is not None:
        end.on_message(event.delivery, event.payload)


def updated(_conn: Any, event: DeliveryUpdated) -> None:
    end: LinkEvents | None = event.link.user_data
    if end is not None:
        end.on_update(event.delivery)


def detached(_conn: Any, event: LinkDetached) -> None:
    end: LinkEvents | None = event.link.user_data
    if end is not None:
        end.on_ended(LinkDetachedError.from_amqp(event.error, f"link {event.link.name!r} detached"))
