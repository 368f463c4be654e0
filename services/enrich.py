"""The enrichment service: scores a text's sentiment, the per-row work of the Spark demo.

``pairlink serve services.enrich`` serves it at the address ``enrich``; its operation
``score(id, text)`` returns ``{"score": float, "label": str}``, the fields of the result schema
``"score double, label string"`` that ``examples/spark_enrich.py`` asks for.

Duplicate detection is on (``dedup_window``): a Spark task that is retried sends its rows'
calls again with the same message-ids (``call_service(key="id")``), and gets the first
answers back without the service scoring (or, in a service with side effects, charging,
writing, sending) those rows twice.
"""

from __future__ import annotations

import math
import re

from pairlink import handler, service

_WORD = re.compile(r"[a-z']+")
_NEGATORS = frozenset({"not", "no", "never", "hardly", "isn't", "wasn't", "don't", "didn't"})
LEXICON: dict[str, float] = {
    "amazing": 3.0,
    "excellent": 3.0,
    "love": 3.0,
    "great": 2.5,
    "good": 2.0,
    "fast": 1.5,
    "happy": 2.0,
    "nice": 1.5,
    "reliable": 1.5,
    "fine": 0.5,
    "ok": 0.3,
    "slow": -1.5,
    "late": -1.5,
    "bad": -2.0,
    "broken": -2.5,
    "poor": -2.0,
    "awful": -3.0,
    "terrible": -3.0,
    "hate": -3.0,
    "refund": -1.0,
}
"""Word -> valence, a small hand-made lexicon in the spirit of VADER/AFINN."""


def score_text(text: str) -> tuple[float, str]:
    """Valence of ``text`` in [-1, 1] and its label: the lexicon words' valences (flipped
    after a negator) summed and squashed by the text's length, so one strong word in a long
    text counts for less than in a short one."""
    tokens = _WORD.findall(text.lower())
    total = 0.0
    negate = False
    for token in tokens:
        valence = LEXICON.get(token)
        if valence is not None:
            total += -valence if negate else valence
        negate = token in _NEGATORS
    score = math.tanh(total / math.sqrt(len(tokens) + 1))
    label = "positive" if score > 0.2 else "negative" if score < -0.2 else "neutral"
    return round(score, 4), label


@service("enrich", mailbox=1024, dedup_window=600)
class Enrich:
    """``score(id, text)``: the text's sentiment score and label. ``scored`` counts the
    handler's runs (a repeat answered by duplicate detection does not run it)."""

    def __init__(self) -> None:
        self.scored = 0

    @handler(inline=True)
    def score(self, id: int, text: str) -> dict[str, float | str]:
        # inline: CPU work of a few microseconds, run as soon as the request is read (a worker
        # thread per call would cost more than the work)
        self.scored += 1
        value, label = score_text(text)
        return {"score": value, "label": label}
