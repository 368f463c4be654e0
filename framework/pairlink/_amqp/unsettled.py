"""The unsettled deliveries of one direction of a session, found by id or by id range.

A disposition names a range [first, last] of delivery ids (serial numbers mod 2**32, §2.7.6)
as wide as the peer likes: here finding the deliveries in it costs O(log n + k), k the keys
in the range, never a scan of the table (a 22-byte disposition over 16,000 unsettled replies
cost 0.2 ms of CPU each time before). Each id is kept "unwrapped", an unbounded integer that
orders ids across the wrap at 2**32, in a sorted list beside a dict by id. Ids arrive in
serial order (ours are allocated in order, the peer's must follow each other): appended, and
only a multi-frame delivery finished after a later one is inserted in place. A delivery
settled by id (the usual case: our own settles, a peer's one-id disposition) leaves its key in
the list until the list is compacted, once dead keys outnumber live ones; a range removes the
keys it visits. Every key is thus visited a bounded number of times in its life.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .link import SERIAL_MASK, SERIAL_MOD, serial_diff

if TYPE_CHECKING:
    from .link import Delivery, Link

SERIAL_HALF = SERIAL_MOD >> 1
COMPACT_SLACK = 64
"""Dead keys the list keeps beyond as many as there are live ones before it is compacted: a
small table is not rebuilt at every settle."""


class SerialIndex:
    """Deliveries by id, and their ids in serial order for ranges."""

    __slots__ = ("_dead", "_keys", "_top", "_top_id", "by_id", "visited")

    def __init__(self) -> None:
        self.by_id: dict[int, Delivery] = {}
        self._keys: list[int] = []  # unwrapped ids, ascending; ``_dead`` of them settled
        self._top_id = 0  # the latest id added, and its unwrapped key
        self._top = 0
        self._dead = 0
        self.visited = 0  # keys ranges have looked at, live or dead: the work they cost

    def __len__(self) -> int:
        return len(self.by_id)

    def key(self, delivery_id: int) -> int:
        """The unwrapped key of ``delivery_id``: the one nearest the latest id added."""
        return self._top + serial_diff(delivery_id, self._top_id)

    def add(self, delivery: Delivery) -> None:
        delivery_id = delivery.delivery_id
        step = (delivery_id - self._top_id) & SERIAL_MASK  # serial_diff, inline: per message
        key = self._top + (step - SERIAL_MOD if step & SERIAL_HALF else step)
        keys = self._keys
        if not keys or key > keys[-1]:
            keys.append(key)
            self._top, self._top_id = key, delivery_id
        else:  # a multi-frame delivery that finished after a later one
            insort(keys, key)
        self.by_id[delivery_id] = delivery

    def discard(self, delivery: Delivery) -> bool:
        """Forget ``delivery`` if it is here (its key goes at the next compaction)."""
        by_id = self.by_id
        if by_id.get(delivery.delivery_id) is not delivery:
            return False
        del by_id[delivery.delivery_id]
        if not by_id:
            self._keys.clear()
            self._dead = 0
        else:
            self._dead += 1
            if self._dead > len(by_id) + COMPACT_SLACK:
                self._keys = [k for k in self._keys if (k & SERIAL_MASK) in by_id]
                self._dead = 0
        return True

    def take_range(self, first: int, span: int) -> list[Delivery]:
        """Remove and return the deliveries with ids in [first, first + span], in order."""
        keys = self._keys
        low = self.key(first)
        start = bisect_left(keys, low)
        end = bisect_right(keys, low + span, start)
        if start == end:
            return []
        self.visited += end - start
        by_id = self.by_id
        taken = [d for k in keys[start:end] if (d := by_id.pop(k & SERIAL_MASK, None)) is not None]
        self._dead -= end - start - len(taken)  # the dead keys among them go too
        del keys[start:end]
        return taken

    def drop_link(self, link: Link) -> int:
        """Forget every delivery of ``link`` (gone with it); how many there were."""
        gone = [d for d in self.by_id.values() if d.link is link]
        for delivery in gone:
            self.discard(delivery)
        return len(gone)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(self.by_id.values())


class Unsettled:
    """One direction's unsettled deliveries: those the peer has decided no outcome for, and
    those it has (rcv-settle-mode second: an outcome declared, the settle still to come) apart,
    so that a disposition that only declares an outcome visits none it already has."""

    __slots__ = ("decided", "held", "open")

    def __init__(self) -> None:
        self.open = SerialIndex()
        self.decided = SerialIndex()
        self.held = 0  # in both: what the session's bound counts (read on every send)

    def __len__(self) -> int:
        return self.held

    def __bool__(self) -> bool:
        return self.held > 0

    def __iter__(self) -> Iterator[Delivery]:
        yield from self.open
        yield from self.decided

    @property
    def visited(self) -> int:
        """Keys the ranges of dispositions have looked at so far."""
        return self.open.visited + self.decided.visited

    def get(self, delivery_id: int) -> Delivery | None:
        return self.open.by_id.get(delivery_id) or self.decided.by_id.get(delivery_id)

    def add(self, delivery: Delivery) -> None:
        self.open.add(delivery)
        self.held += 1

    def discard(self, delivery: Delivery) -> bool:
        """Forget a delivery settled (by us, or by the peer naming its id alone)."""
        if self.open.discard(delivery) or self.decided.discard(delivery):
            self.held -= 1
            return True
        return False

    def settle_range(self, first: int, span: int) -> list[Delivery]:
        """Remove and return every delivery in [first, first + span]: the peer settled them."""
        taken = self.open.take_range(first, span)
        if self.decided.by_id:
            taken += self.decided.take_range(first, span)
        self.held -= len(taken)
        return taken

    def decide_range(self, first: int, span: int) -> list[Delivery]:
        """The deliveries in [first, first + span] with no outcome yet, moved among the
        decided: the peer declared one for them."""
        taken = self.open.take_range(first, span)
        for delivery in taken:
            self.decided.add(delivery)
        return taken

    def decide(self, delivery: Delivery) -> bool:
        """Move one delivery among the decided; False if it was not without an outcome."""
        if not self.open.discard(delivery):
            return False
        self.decided.add(delivery)
        return True

    def drop_link(self, link: Link) -> None:
        self.held -= self.open.drop_link(link) + self.decided.drop_link(link)
