"""Who called, across gateways: the caller a gateway vouches for, and when a node believes it.

Behind a gateway every caller reaches the next hop as the gateway's one SASL user. So that the
service still tells its callers apart (its dedup store keeps replies per caller; a handler reads
``current_call().user``), a gateway says on each upstream pair's attach whom the pair carries
for: the link property ``pairlink:caller``, a list ``[user, *via]``, the caller's SASL user (null
for an anonymous one) and the SASL users of the gateways it came through, the caller's side
first. A pair carries one caller, so it is said once per pair and costs nothing per message.

A node (service or gateway) believes the property only on a connection whose SASL user it
trusts to vouch (its ``vouching_users``): the caller is then the one named, and that user is
added to ``via``. From anyone else the claim is ignored and the caller is the connection's own
SASL user. A gateway sends on the caller it judged so, never what its peer claimed, so a peer
cannot name someone else; one gateway trusting the one before it extends ``via``, so chains
compose. This module judges and writes the property; its users log and refuse.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from pairlink._amqp.types import Fields, Symbol

CALLER = Symbol("pairlink:caller")
"""The attach property by which a gateway vouches for the caller its pair carries."""
MAX_VIA = 8
"""Gateways a believed caller may have come through: a longer chain is a loop or a mistake of
configuration, and a claim naming more is refused (``amqp:invalid-field``)."""
MAX_NAME = 256
"""Characters of a name in a claim (a SASL user's): a longer one is refused
(``amqp:invalid-field``), so a claim costs a link at most a few KiB."""


class InvalidClaim(ValueError):
    """A trusted voucher's ``pairlink:caller`` is not ``[user, *via]`` within the bounds."""


@attrs.frozen(cache_hash=True)
class Identity:
    """Who called: ``user``, their SASL user (None: anonymous), as authenticated by the first
    node they reached; ``via``, the SASL users of the gateways that vouched for them since,
    the caller's side first (empty: they called directly)."""

    user: str | None
    via: tuple[str, ...] = ()

    def properties(self) -> Fields:
        """The attach property that vouches for this caller at the next hop."""
        return {CALLER: [self.user, *self.via]}


def judge_caller(
    user: str | None, properties: Fields | None, vouching: Collection[str]
) -> tuple[Identity, bool]:
    """The caller of a link opened by a connection of SASL ``user``, whose attach had
    ``properties``; and whether a claim was ignored (``user`` is not one of ``vouching``).
    Raises :class:`InvalidClaim` for a trusted user's claim that is malformed or too long."""
    claim = None if properties is None else properties.get(CALLER)
    if claim is None:
        return Identity(user), False
    if user is None or user not in vouching:
        return Identity(user), True
    if not isinstance(claim, list) or not 1 <= len(claim) <= MAX_VIA:
        raise InvalidClaim(f"pairlink:caller must be a list of 1 to {MAX_VIA} names")
    caller, *via = claim
    for name in (caller, *via) if caller is not None else via:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise InvalidClaim(f"pairlink:caller names must be strings of 1 to {MAX_NAME} chars")
    return Identity(caller, (*via, user)), False
