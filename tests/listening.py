"""Connection handlers for test listeners that answer each link on its own and keep nothing
per connection: ``listen(url, accept=answering(on_attach))``, or ``accept=no_links``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs

from pairlink._amqp.errors import NOT_ALLOWED
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Error
from pairlink._io.connection import AmqpConnection, OnAttach


@attrs.frozen
class EachLink:
    """The handler of one connection: each link its peer opens goes to ``answer``."""

    conn: AmqpConnection
    answer: OnAttach

    def on_attach(self, link: Link) -> None:
        self.answer(self.conn, link)

    def on_closed(self) -> None:
        """Nothing was kept for the connection."""


def answering(answer: OnAttach) -> Callable[[AmqpConnection], EachLink]:
    """A listener's ``accept`` that answers every link of every connection with ``answer``."""
    return functools.partial(EachLink, answer=answer)


def _refuse(conn: AmqpConnection, link: Link) -> None:
    conn.refuse(link, Error(NOT_ALLOWED, "this test listener takes no links"))


no_links = answering(_refuse)
"""The ``accept`` of a listener whose test opens no links: any link is refused."""
