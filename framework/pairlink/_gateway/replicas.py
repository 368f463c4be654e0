"""A route's next hops: one :class:`Upstream` per URL of its ``upstream`` (replicas), and
where each new pair goes among them.

Link pairing pins a pair's calls to one replica, so a route balances where pairs are placed:
each new pair goes to the ``ready`` replica that the client's rule picks
(:mod:`pairlink._client.placement`): one whose pairs have credit left (or that has none yet)
before a full one, then the one carrying the fewest pairs, ties in turn. A replica whose main
connection is down, whose ``$health`` says ``draining`` or goes unanswered, or that detached a
pair because it stops, gets no new pair; it is reconnected with backoff and used again once
its ``$health`` says ``serving``. Its pairs in flight end as they would with one next hop.

Each caller has a :class:`Lane` per replica it has pairs on, opened with its first pair there:
the connections to a replica stay each caller's own (the next hop's per-connection fairness),
and callers behind one port of a ``serve --workers N`` are spread over its workers as the
kernel spreads connections.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import trio

from pairlink._client.placement import ReplicaState, Rotation
from pairlink._gateway.upstream import Lane, Upstream, UpstreamUnavailable


class RouteReplicas:
    """The upstreams of one route (shared with other routes of the same URLs and
    credentials), in the order its config names them."""

    def __init__(self, upstreams: Sequence[Upstream]) -> None:
        self.upstreams = list(upstreams)
        self._rotation = Rotation()
        self._changed = trio.Event()
        for upstream in self.upstreams:
            upstream.on_state.append(self._state_changed)

    def _state_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def up(self) -> bool:
        """Some replica's main connection is open."""
        return any(upstream.up for upstream in self.upstreams)

    @property
    def serving(self) -> bool:
        """Some replica takes new pairs: the route is ``serving``."""
        return any(upstream.ready for upstream in self.upstreams)

    def states(self) -> list[ReplicaState]:
        """Each replica's state, in the config's order (no address: those stay inside)."""
        return [upstream.state for upstream in self.upstreams]

    async def lane(self, caller: Hashable) -> Lane:
        """``caller``'s lane to the replica its next pair goes to, once one is ready (at
        start: or once every replica has been tried, so that one slow to answer does not hold
        the others' pairs); ``UpstreamUnavailable`` if none is ready."""
        while not self.serving and not all(u.tried.is_set() for u in self.upstreams):
            await self._changed.wait()
        ready = [upstream for upstream in self.upstreams if upstream.ready]
        chosen = self._rotation.pick(ready, Upstream.rank)
        if chosen is None:
            raise UpstreamUnavailable("the next hop is unreachable")
        return chosen.lane(caller)

    def leave(self, caller: Hashable) -> None:
        """``caller`` is gone: its lanes to every replica close."""
        for upstream in self.upstreams:
            upstream.leave(caller)
