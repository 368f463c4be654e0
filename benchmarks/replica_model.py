"""What a 2-core machine cannot show: many replicas and callers, balanced by credit or in turn.

A discrete-event model (issue 23) of ``replicas`` service replicas, each a mailbox of ``mailbox``
slots served by ``workers`` workers, and ``callers`` clients each connected to every replica.
Calls arrive as a Poisson stream at ``load`` of the replicas' total capacity, each to a caller
chosen at random. Service times are exponential; one replica is ``slow`` times slower.

What is modelled of pairlink, and how:

* **Credit is the mailbox.** A call holds a slot of its replica until it is answered; a free
  slot goes out as one credit to a caller, reaching it ``flow_delay`` later. A caller holds at
  most one credit per replica (as a mailbox shares its slots when callers outnumber them).
* **credit** (today's mailbox): free slots go to the callers in turn that hold none of the
  replica's credit, whether or not they have calls to send. A caller sends each call on a
  replica where it holds credit (ties rotate: the credit held longest first); with credit
  nowhere, the call waits for the first credit to come.
* **credit+demand**: the same, but free slots go only to callers with calls waiting for credit
  (what a sender's flow tells its receiver in AMQP's ``available`` field), the replica with
  the most free slots answering first.
* **round-robin**: a caller sends its calls to the replicas in turn, whatever they hold, and
  each replica queues what it cannot run yet (gRPC's ``round_robin`` over HTTP/2 streams).

What it shows (default parameters): with 1,000 callers a replica's credit is scattered over
callers that have nothing to send, so plain credit tells a caller little about load (a fast
replica's queue fills to its mailbox); credit that follows demand keeps every queue short and
gives the slow replica about its share of the capacity.

Not modelled: the network beyond ``flow_delay``, drains, the reserve, connection loss. The
latency of a call runs from its arrival to its answer (waits for credit included).

Run: ``python -m benchmarks.replica_model [--calls N] [--seed S] ...``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import random
import statistics
from collections import deque
from collections.abc import Callable

import attrs

POLICIES = ("credit", "credit+demand", "round-robin")


@attrs.frozen
class Model:
    """The parameters of one run; times in milliseconds."""

    replicas: int = 100
    callers: int = 1_000
    mailbox: int = 128
    workers: int = 4
    service_ms: float = 10.0  # mean service time of a normal replica
    slow: float = 4.0  # the slow replica's service times are this many times longer
    load: float = 0.85  # arrival rate, as a fraction of all replicas' capacity
    flow_delay: float = 0.25  # ms for a flow (credit) to reach its caller
    calls: int = 200_000
    seed: int = 1

    @property
    def capacity(self) -> float:
        """Calls per millisecond all replicas serve at most."""
        fast = (self.replicas - 1) * self.workers / self.service_ms
        return fast + self.workers / (self.service_ms * self.slow)


@attrs.frozen
class Outcome:
    policy: str
    p50: float  # ms
    p99: float
    slow_share: float  # of the calls, those sent to the slow replica
    fast_p99: float  # p99 of the calls answered by the other replicas
    unanswered: int  # calls still waiting when the arrivals end (counted with their wait so far)


@attrs.define(eq=False)
class Replica:
    index: int
    mean: float
    free: int  # slots neither held by a call nor out as credit
    turn: deque[int]  # callers holding none of its credit, in turn
    idle: int  # workers without a call
    queue: deque[float] = attrs.field(factory=deque)  # arrivals of the calls waiting for a worker


@attrs.define(eq=False)
class Caller:
    index: int
    credit: dict[int, float] = attrs.field(factory=dict)  # replica -> when last used
    waiting: deque[float] = attrs.field(factory=deque)  # arrivals of calls waiting for credit
    next_replica: int = 0  # round-robin: where its next call goes
    coming: int = 0  # credit granted to it and not arrived yet


class Simulation:
    """One run of ``model`` under ``policy``."""

    def __init__(self, model: Model, policy: str) -> None:
        self.model = model
        self.policy = policy
        self.rng = random.Random(model.seed)
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.latencies: list[float] = []
        self.fast_latencies: list[float] = []
        self.slow_sent = 0  # calls sent to the slow replica
        self.pending: set[float] = set()  # arrivals of the calls not answered yet
        self.demand: deque[int] = deque()  # callers with calls waiting for credit (demand)
        self.callers = [Caller(c, next_replica=c % model.replicas) for c in range(model.callers)]
        self.replicas = []
        for r in range(model.replicas):
            mean = model.service_ms * (model.slow if r == 0 else 1.0)
            turn = deque(self.rng.sample(range(model.callers), model.callers))
            self.replicas.append(Replica(r, mean, model.mailbox, turn, model.workers))

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self._order), action))

    def run(self) -> Outcome:
        if self.policy != "round-robin":
            for replica in self.replicas:
                self.grant(replica)
        rate = self.model.load * self.model.capacity
        arrival = 0.0
        for _ in range(self.model.calls):
            arrival += self.rng.expovariate(rate)
            caller = self.callers[self.rng.randrange(self.model.callers)]
            self.at(arrival, functools.partial(self.arrive, caller, arrival))
        end = arrival
        while self.events and self.events[0][0] <= end:
            self.now, _, action = heapq.heappop(self.events)
            action()
        return self.outcome()

    # -- credit ------------------------------------------------------------------------

    def grant(self, replica: Replica) -> None:
        """Free slots go to the callers in turn that hold none of this replica's credit; with
        demand, first to callers whose calls wait for credit (in the order they began to)."""
        while replica.free and self.demand:
            caller = self.callers[self.demand[0]]
            if len(caller.waiting) <= caller.coming or replica.index in caller.credit:
                self.demand.popleft()  # its waiting calls have credit on the way
                continue
            self.demand.rotate(-1)  # it may need more: behind the others
            self.give(replica, caller)
        while replica.free and replica.turn and self.policy != "credit+demand":
            self.give(replica, self.callers[replica.turn.popleft()])

    def _room(self, replica: Replica) -> tuple[int, float]:
        """Its free slots (ties broken at random)."""
        return replica.free, self.rng.random()

    def give(self, replica: Replica, caller: Caller) -> None:
        replica.free -= 1
        caller.coming += 1
        self.at(self.now + self.model.flow_delay, lambda: self.credited(caller, replica))

    def credited(self, caller: Caller, replica: Replica) -> None:
        caller.coming -= 1
        caller.credit[replica.index] = -1.0  # never used: first in the rotation
        if caller.waiting:
            self.send(caller, replica, caller.waiting.popleft())

    # -- calls -------------------------------------------------------------------------

    def arrive(self, caller: Caller, arrival: float) -> None:
        self.pending.add(arrival)
        if self.policy == "round-robin":
            replica = self.replicas[caller.next_replica]
            caller.next_replica = (replica.index + 1) % self.model.replicas
            self.enqueue(replica, arrival)
        elif caller.credit:
            chosen = min(caller.credit, key=caller.credit.__getitem__)  # least recently used
            self.send(caller, self.replicas[chosen], arrival)
        else:
            caller.waiting.append(arrival)
            if self.policy == "credit+demand":
                self.demand.append(caller.index)
                # every replica hears of it; the one with the most room answers first
                roomiest = max(self.replicas, key=self._room)
                if roomiest.free:
                    self.grant(roomiest)

    def send(self, caller: Caller, replica: Replica, arrival: float) -> None:
        del caller.credit[replica.index]
        if self.policy == "credit":
            replica.turn.append(caller.index)  # it wants this replica's credit again
        self.enqueue(replica, arrival)

    def enqueue(self, replica: Replica, arrival: float) -> None:
        if replica.index == 0:
            self.slow_sent += 1
        if replica.idle:
            replica.idle -= 1
            self.start(replica, arrival)
        else:
            replica.queue.append(arrival)

    def start(self, replica: Replica, arrival: float) -> None:
        took = self.rng.expovariate(1.0 / replica.mean)
        self.at(self.now + took, lambda: self.answered(replica, arrival))

    def answered(self, replica: Replica, arrival: float) -> None:
        latency = self.now - arrival
        self.pending.discard(arrival)
        self.latencies.append(latency)
        if replica.index:
            self.fast_latencies.append(latency)
        if replica.queue:
            self.start(replica, replica.queue.popleft())
        else:
            replica.idle += 1
        if self.policy != "round-robin":
            replica.free += 1
            self.grant(replica)

    def outcome(self) -> Outcome:
        # a call unanswered when the arrivals end counts with the wait it has had so far
        waits = self.latencies + [self.now - arrival for arrival in self.pending]
        cuts = statistics.quantiles(waits, n=100)
        fast = statistics.quantiles(self.fast_latencies, n=100)
        return Outcome(
            self.policy,
            p50=cuts[49],
            p99=cuts[98],
            slow_share=self.slow_sent / self.model.calls,
            fast_p99=fast[98],
            unanswered=len(self.pending),
        )


def simulate(model: Model, policy: str) -> Outcome:
    return Simulation(model, policy).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Model()
    for field in attrs.fields(Model):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(getattr(defaults, field.name)), default=None)
    args = parser.parse_args()
    given = {k: v for k, v in vars(args).items() if v is not None}
    model = attrs.evolve(defaults, **given)
    print(
        f"{model.replicas} replicas (mailbox {model.mailbox}, {model.workers} workers, "
        f"{model.service_ms:g} ms; one {model.slow:g}x slower), {model.callers} callers, "
        f"load {model.load:.0%} of capacity, {model.calls:,} calls"
    )
    print(f"{'policy':<12} {'p50 ms':>8} {'p99 ms':>9} {'fast p99':>9} {'slow share':>11} "
          f"{'unanswered':>11}")  # fmt: skip
    for policy in POLICIES:
        o = simulate(model, policy)
        print(
            f"{o.policy:<12} {o.p50:8.1f} {o.p99:9.1f} {o.fast_p99:9.1f} "
            f"{o.slow_share:11.3%} {o.unanswered:11,}"
        )
    print(f"(an even spread would give the slow replica {1 / model.replicas:.3%} of the calls)")


if __name__ == "__main__":
    main()
