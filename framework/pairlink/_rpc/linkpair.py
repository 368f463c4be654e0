"""OASIS Link Pairing v1.0 (``LINK-PAIRING-RULES.md``, LP-1..LP-12) as pure functions.

Both ends of a pair use these: the client to decide whether it may pair (LP-2) and to check the
answer it got (LP-5), the service to judge each attach it receives (LP-4..LP-7,
``judge_attach``). Nothing here touches a connection: callers pass in what the attach frames
said and act on the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from pairlink._amqp.errors import NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED
from pairlink._amqp.messaging import Source, Target
from pairlink._amqp.performatives import Attach
from pairlink._amqp.types import Fields, Symbol

LINK_PAIR_V1_0 = Symbol("LINK_PAIR_V1_0")
"""The connection capability (LP-1 offers it, LP-2 desires it)."""
PAIRED = Symbol("paired")


def paired_properties() -> Fields:
    """The attach properties of either half of a pair (LP-4)."""
    return {PAIRED: True}


def offers_pairing(offered_capabilities: Iterable[object] | None) -> bool:
    """LP-2: a pair may be initiated only when the peer's open offered the capability."""
    return any(str(c) == LINK_PAIR_V1_0 for c in offered_capabilities or ())


def is_paired(properties: Fields | None) -> bool:
    """LP-4: only the boolean ``true`` under ``paired`` means paired; anything else does not."""
    if not properties:
        return False
    value = properties.get(PAIRED)
    return value is True


def paired_mismatch(ours: Fields | None, theirs: Fields | None) -> bool:
    """LP-5: the two attach frames of one link disagree about ``paired``."""
    return is_paired(ours) != is_paired(theirs)


def mirrors(
    source: str | None, target: str | None, other_source: str | None, other_target: str | None
) -> bool:
    """LP-3/LP-7: two opposite links' addresses mirror each other (source of one is the
    target of the other, both ways)."""
    return source == other_target and target == other_source


# -- the responder's side: judging an attach the peer sent (LP-4..LP-7) --------------------


@attrs.frozen
class PairHalf:
    """What one attach frame says that the pairing rules look at: the ``paired`` property
    (LP-4, already reduced to a bool by ``is_paired``) and the terminus addresses."""

    paired: bool
    source: str | None
    target: str | None

    @classmethod
    def of(cls, attach: Attach) -> PairHalf:
        """What ``attach`` says: ``paired`` per LP-4 and the terminus addresses."""
        return cls(is_paired(attach.properties), _address(attach.source), _address(attach.target))


def _address(terminus: Source | Target | None) -> str | None:
    return None if terminus is None or terminus.address is None else str(terminus.address)


def unknown_address(address: str | None) -> str:
    """The description of an ``amqp:not-found`` refusal: one line naming the address."""
    return f"no service at the address {address!r}"


@attrs.frozen
class Refusal:
    """How to turn an attach down: the error condition, and whether our answering attach
    carries a null local terminus (the link was never created: unknown address, LP-6) or
    mirrors the peer's (created, then detached at once: LP-5, LP-7)."""

    condition: str
    description: str
    null_terminus: bool


def judge_attach(
    half: PairHalf,
    *,
    known: bool,
    pairs: bool,
    opposite: PairHalf | None,
    address: str | None = None,
) -> Refusal | None:
    """A responder's verdict on an incoming attach; None accepts it.

    ``known``: the address names a node here (``address``, named in the refusal when it is
    not, so the caller reads which address was wrong); ``pairs``: that node supports pairing;
    ``opposite``: the peer's link of the same name in the other direction on this
    connection, if one exists. The checks run in this order: an unknown node is not found
    whatever the attach says; LP-6 for a paired attach to a node that does not pair; then
    LP-5 (the two halves disagree about ``paired``) and LP-7 (paired halves whose addresses
    do not mirror each other).
    """
    if not known:
        return Refusal(NOT_FOUND, unknown_address(address), null_terminus=True)
    if half.paired and not pairs:
        return Refusal(NOT_IMPLEMENTED, "this address does not support link pairing", True)
    if opposite is None:
        return None
    if half.paired != opposite.paired:
        # LP-5, read for the responder: a pair is two links known by one name, so a half
        # whose `paired` differs from its partner's breaks the pair's precondition
        return Refusal(
            PRECONDITION_FAILED,
            "the two links of this name disagree about the paired property",
            null_terminus=False,
        )
    if half.paired and not mirrors(half.source, half.target, opposite.source, opposite.target):
        return Refusal(
            PRECONDITION_FAILED,
            "the paired link of this name has other terminus addresses",
            null_terminus=False,
        )
    return None
