"""Slowing down password guessing, one peer address at a time.

A listener asks :meth:`LoginThrottle.admit` before it reads a new connection's first byte.
An address with no recent failed login is admitted at once. After a failure, every new
connection from that address takes the next free slot, ``penalty`` seconds after the one
before it, so guesses from one address are serialised at that pace however many connections
carry them in parallel (with the default penalty, 100 wrong passwords take over 12 s), while
every other address goes on unslowed. A success with real credentials clears the address;
a quiet one is forgotten after ``forget_after`` seconds, and the table holds ``max_addresses``
at most (oldest forgotten first), so an attacker cannot grow it either.

Pure bookkeeping: the caller passes the time in and does the waiting.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

LOGIN_PENALTY = 0.125
"""Seconds between two login attempts from an address whose last attempt failed."""
MAX_LOGIN_WAIT = 30.0
"""A connection that would wait longer than this for its slot is refused at once."""
FORGET_AFTER = 60.0
"""Seconds after its last failure that an address is trusted again."""
MAX_ADDRESSES = 10_000
"""Addresses with recent failures remembered at most."""


@attrs.define
class _Suspect:
    next_slot: float
    last_failure: float


@attrs.define
class LoginThrottle:
    """Recent failed logins by peer address (see the module docstring)."""

    penalty: float = LOGIN_PENALTY
    max_wait: float = MAX_LOGIN_WAIT
    forget_after: float = FORGET_AFTER
    max_addresses: int = MAX_ADDRESSES
    _suspects: OrderedDict[str, _Suspect] = attrs.field(factory=OrderedDict, init=False)

    def admit(self, address: str, now: float) -> float | None:
        """Seconds a new connection from ``address`` must wait before it is served (0: at
        once), or None when that wait would pass ``max_wait`` (refuse it)."""
        suspect = self._suspects.get(address)
        if suspect is None:
            return 0.0
        if now - suspect.last_failure > self.forget_after:
            del self._suspects[address]
            return 0.0
        wait = max(0.0, suspect.next_slot - now)
        if wait > self.max_wait:
            return None
        suspect.next_slot = now + wait + self.penalty
        return wait

    def failed(self, address: str, now: float) -> None:
        """A login from ``address`` was refused."""
        suspect = self._suspects.pop(address, None)
        if suspect is None:
            suspect = _Suspect(next_slot=now + self.penalty, last_failure=now)
        suspect.last_failure = now
        suspect.next_slot = max(suspect.next_slot, now + self.penalty)
        self._suspects[address] = suspect  # most recent last
        while len(self._suspects) > self.max_addresses:
            self._suspects.popitem(last=False)

    def succeeded(self, address: str) -> None:
        """A login with real credentials from ``address`` succeeded."""
        self._suspects.pop(address, None)

    def __len__(self) -> int:
        return len(self._suspects)
