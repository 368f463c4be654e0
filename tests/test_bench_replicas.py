"""``benchmarks/replicas.py`` measures what it says on real ``pairlink serve`` processes: a
short run prints every line `make bench` and the README cite, and its placement figures hold
even in one short round (equal replicas share evenly, a 4x slower one gets far fewer calls)."""

from __future__ import annotations

import re

import pytest

from benchmarks import replicas


@pytest.mark.timeout(120)
def test_a_short_run_prints_the_placement_and_the_overhead(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert replicas.main(["--quick"]) == 0
    out = capsys.readouterr().out
    even = re.search(r"^replicas equal: .* max deviation from even (\d+\.\d)%", out, re.M)
    slow = re.search(r"^replicas one 4x slower: .* vs a fast one's: (\d\.\d\d)", out, re.M)
    assert even is not None and slow is not None, out
    assert float(even.group(1)) <= 10.0, out
    assert float(slow.group(1)) < 0.4, out  # about 0.25; a CPU shared with the client adds
    for line in (
        r"^replicas equal +latency: #1 p50 ",
        r"^replicas slow +latency: #1 p50 ",
        r"^replicas fast ones' p99 with a slow one vs all equal: .* ratio \d\.\d\d$",
        r"^replicas overhead: .* calls per CPU-second .* ratio \d\.\d\d\d ",
    ):
        assert re.search(line, out, re.M), (line, out)
