"""The reconnect delays clients and gateway upstreams share."""

from __future__ import annotations

from pairlink._io.backoff import jittered_backoff


def test_backoff_is_exponential_capped_and_jittered() -> None:
    for failures in range(1, 12):
        ceiling = min(2.0, 0.1 * 2 ** (failures - 1))
        delays = {jittered_backoff(failures, 0.1, 2.0) for _ in range(20)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered, so peers cut off together spread out


def test_no_failure_yet_counts_as_the_first() -> None:
    assert 0.05 <= jittered_backoff(0, 0.1, 2.0) <= 0.1
