"""The codec benchmark still measures what it says: each stack's path carries the request
intact, and a short run prints the lines `make bench` and the README cite."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks import codec


def test_every_path_carries_the_request() -> None:
    payload = codec.request_payload()
    # Each raises AssertionError when its stack loses or garbles the request.
    codec.our_messages(20)
    codec.proton_messages(20)
    codec.OurEngines(payload).transfers(20)
    codec.ProtonEngines(payload).transfers(20)
    codec.ProtonEngines(payload, events=False).transfers(20)
    codec.our_frame_codec(payload)(20)


def test_short_run_prints_the_ratios(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["codec", "--rounds", "1", "-n", "50"])
    codec.main()
    out = capsys.readouterr().out
    for name in (
        "codec message ratio vs proton",
        "codec frame ratio vs proton",
        "codec frame ratio vs proton without events",
        "codec ratio vs proton",
    ):
        assert re.search(rf"^{name}: \d+\.\d\d$", out, re.MULTILINE), (name, out)
