"""OASIS Link Pairing v1.0 (``LINK-PAIRING-RULES.md``, LP-1..LP-12) as pure functions.

Both ends of a pair use these: the client to decide whether it may pair (LP-2) and to check the
answer it got (LP-5), the service to judge each attach it receives (LP-4..LP-7). Nothing here
touches a connection: callers pass in what the attach frames said and act on the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from framework.amqp.types import Symbol

LINK_PAIR_V1_0 = Symbol("LINK_PAIR_V1_0")
"""The connection capability (LP-1 offers it, LP-2 desires it)."""
PAIRED = Symbol("paired")


def paired_properties() -> dict[Symbol, Any]:
    """The attach properties of either half of a pair (LP-4)."""
    return {PAIRED: True}


def offers_pairing(offered_capabilities: Iterable[Any] | None) -> bool:
    """LP-2: a pair may be initiated only when the peer's open offered the capability."""
    return any(str(c) == LINK_PAIR_V1_0 for c in offered_capabilities or ())


def is_paired(properties: Mapping[Any, Any] | None) -> bool:
    """LP-4: only the boolean ``true`` under ``paired`` means paired; anything else does not."""
    if not properties:
        return False
    value = properties.get(PAIRED)
    return value is True


def paired_mismatch(ours: Mapping[Any, Any] | None, theirs: Mapping[Any, Any] | None) -> bool:
    """LP-5: the two attach frames of one link disagree about ``paired``."""
    return is_paired(ours) != is_paired(theirs)


def mirrors(
    source: str | None, target: str | None, other_source: str | None, other_target: str | None
) -> bool:
    """LP-3/LP-7: two opposite links' addresses mirror each other (source of one is the
    target of the other, both ways)."""
    return source == other_target and target == other_source
