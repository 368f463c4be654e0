"""The ``pairlink`` command line.

The ``serve``, ``call`` and ``gateway`` subcommands arrive with the service, client and gateway
layers; until then the command knows its version and its help.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import metadata


def _version() -> str:
    # The installed distribution is the one source of the version (pyproject.toml).
    try:
        return metadata.version("pairlink")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pairlink",
        description="Request-response services over AMQP 1.0 paired links.",
    )
    parser.add_argument("--version", action="version", version=f"pairlink {_version()}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pairlink`` console script; returns the process exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0
