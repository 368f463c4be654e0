"""The links a server holds across all its connections, and how they are shared.

``max_links_total`` bounds them all (a link costs about 3 KiB: issue 22 measured 2.9 KiB over
64,000). So that one party cannot take them all and lock everyone else out, a connection
holding :data:`FEW_LINKS` links or more (a swarm, not a client's pairs to a few services) gets
more only while

* its SASL user (all anonymous peers together count as one) holds less than half of them, and
* the last ``limit // RESERVE_DIVISOR`` are free: they are kept for connections holding fewer,
  so that a new caller's pair still finds room while connections of thousands of links fill
  the rest.

A connection holding fewer is refused only at the limit itself, which such connections cannot
reach alone: ``max_connections`` (3/4 of the open-file limit) times :data:`FEW_LINKS` is far
below it.

A link past any of them is refused with ``amqp:resource-limit-exceeded`` and a description
that says which bound it met.
"""

from __future__ import annotations

from collections import Counter

import attrs

RESERVE_DIVISOR = 32
"""The server keeps ``max_links_total // RESERVE_DIVISOR`` links (2,048 of the default 65,536)
for connections holding fewer than :data:`FEW_LINKS`: a few hundred new callers' pairs."""
FEW_LINKS = 16
"""Links a connection may hold and still take from the reserve: a client's pairs to a handful
of services, not a swarm."""


@attrs.define(eq=False)
class LinkBudget:
    """The links a server holds (``used``), by SASL user, against ``limit``."""

    limit: int
    used: int = 0
    by_user: Counter[str | None] = attrs.field(factory=Counter)

    @property
    def share(self) -> int:
        """The most links one user's connections of many links hold: half of the limit."""
        return max(1, self.limit // 2)

    @property
    def reserve(self) -> int:
        return self.limit // RESERVE_DIVISOR

    def refusal(self, user: str | None, held: int) -> str | None:
        """Why a new link of ``user``, on a connection holding ``held`` links, is refused
        (None: it is taken)."""
        if self.used >= self.limit:
            return f"more than {self.limit} links on this server"
        if held < FEW_LINKS:
            return None
        if self.by_user[user] >= self.share:
            who = "anonymous peers" if user is None else repr(user)
            return f"{who} hold {self.share} links, their share of this server's {self.limit}"
        if self.used >= self.limit - self.reserve:
            return (
                f"this server's links are taken but for the last {self.reserve}, kept for "
                f"connections holding fewer than {FEW_LINKS}"
            )
        return None

    def take(self, user: str | None) -> None:
        self.used += 1
        self.by_user[user] += 1

    def give_back(self, user: str | None) -> None:
        self.used -= 1
        self.by_user[user] -= 1
        if not self.by_user[user]:
            del self.by_user[user]
