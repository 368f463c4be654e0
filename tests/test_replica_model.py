"""The replica model of ``benchmarks.replica_model`` (issue 23) shows what it is there to show,
on a small seeded run: round-robin sends the slow replica its even share, credit that follows
demand far less, with a shorter tail."""

from __future__ import annotations

from benchmarks.replica_model import Model, simulate

SMALL = Model(replicas=10, callers=100, calls=20_000)


def test_credit_that_follows_demand_spares_the_slow_replica_and_shortens_the_tail() -> None:
    turns = simulate(SMALL, "round-robin")
    demand = simulate(SMALL, "credit+demand")
    even = 1 / SMALL.replicas
    assert abs(turns.slow_share - even) < even * 0.1
    assert demand.slow_share < even / 2  # it serves a quarter as fast
    assert demand.p99 < turns.p99 / 2
    assert demand.unanswered < turns.unanswered
