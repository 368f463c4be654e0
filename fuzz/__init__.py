"""Coverage-guided fuzzing of pairlink with atheris: ``make fuzz`` (see fuzz/README.md).

Only paths here: this package is imported before the fuzzer's instrumentation hook is in
place, so it must not import pairlink.
"""

from __future__ import annotations

from pathlib import Path

TARGET_NAMES = ("engine", "container", "gateway")
"""The fuzz targets (``fuzz.targets.TARGETS``), in the order ``make fuzz`` runs them."""

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
"""Each target's working corpus grows in ``corpus/<target>/`` (not kept in git)."""
CRASHERS = HERE / "crashers"
"""Where libFuzzer writes an input that failed (``crash-*``) or ran too long (``timeout-*``)."""
DICTIONARY = HERE / "amqp.dict"
"""AMQP tokens (descriptors, constructors, the pairing rules' words) for the mutator."""


def seed_folder(target: str) -> Path:
    """The committed seed corpus of ``target``: the engine and the container share one (an
    anonymous peer), the gateway's peer logs in with SASL PLAIN."""
    return CORPUS / "seeds" / ("gateway" if target == "gateway" else "direct")
