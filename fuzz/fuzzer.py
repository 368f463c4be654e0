"""One fuzz target under atheris (libFuzzer), coverage-guided by pairlink's own code.

    python -m fuzz.fuzzer TARGET [libFuzzer options] [CORPUS_DIR... | INPUT_FILE...]

TARGET is ``engine``, ``container`` or ``gateway`` (``fuzz.targets``). Everything after it
goes to libFuzzer: corpus folders to grow, or input files to run once (reproducing a crasher);
``-max_total_time=N``, ``-timeout=1``, ``-minimize_crash=1`` and the rest work as usual.
Only ``pairlink`` and ``services`` are instrumented: coverage of Trio or the standard library
would only steer the fuzzer away from ours.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import atheris

from fuzz import TARGET_NAMES


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGET_NAMES:
        names = ",".join(TARGET_NAMES)
        sys.exit(f"usage: python -m fuzz.fuzzer {{{names}}} [libFuzzer options]")
    name = sys.argv[1]
    # pairlink is imported here, inside the hook that instruments it, and not before
    with atheris.instrument_imports(include=["pairlink", "services"]):
        from fuzz.targets import TARGETS
    target = TARGETS[name]

    def test_one_input(data: bytes) -> None:
        target(data)

    atheris.Setup([_self_command(name), *sys.argv[2:]], test_one_input)
    atheris.Fuzz()


def _self_command(name: str) -> str:
    """What libFuzzer runs (through the shell) when it starts a copy of itself, for
    ``-minimize_crash``, ``-merge`` or ``-fork``: this module for the same target, from any
    folder (argv[0] would be this file, which is not executable on its own)."""
    root = Path(__file__).resolve().parent.parent
    python = shlex.quote(sys.executable)
    return f"env PYTHONPATH={shlex.quote(str(root))} {python} -m fuzz.fuzzer {name}"


if __name__ == "__main__":
    main()
