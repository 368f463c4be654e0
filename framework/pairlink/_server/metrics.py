"""A server's Prometheus metrics (``open_server(metrics_listen=...)``, ``pairlink serve
--metrics-listen``): how each service's calls were answered and how long that took, counted as
they are answered; and what each service holds now, read from its actor at each scrape.

Counted per call only when metrics are on: the actor's ``observer`` is then a
:class:`CallMetrics`, else None (one test per call). An operation the service does not have
is counted as ``<unknown>``: the label takes a caller's words only when they name one of the
service's operations, so no caller can grow the label sets without bound.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING

import trio

from pairlink._amqp.link import Delivery
from pairlink._server.actor import Actor
from pairlink._telemetry.metrics import (
    connections_gauge,
    counter,
    gauge,
    new_registry,
    parse_listen,
    prometheus,
)

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

UNKNOWN_OPERATION = "<unknown>"
"""The operation label of calls for an operation the service does not have."""
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Seconds: from 100 µs (an inline call answered at once) to a minute (a slow batch call)."""


class CallMetrics:
    """One service's observer (``Actor.observer``): counts each answer by operation and
    status, and times it from the request's arrival in the actor; counts each row of a batch
    answered by its own status (a batch is one call of ``pairlink_calls``)."""

    __slots__ = (
        "_calls",
        "_counters",
        "_latency",
        "_operations",
        "_rows",
        "_service",
        "_since",
        "_timers",
    )

    def __init__(
        self,
        service: str,
        operations: Collection[str],
        calls: Counter,
        latency: Histogram,
        rows: Counter,
    ) -> None:
        self._service = service
        self._operations = operations
        self._calls = calls
        self._latency = latency
        self._rows = rows
        # weak: a request that is never answered (refused, or its caller left) is forgotten
        # with its delivery
        self._since: weakref.WeakKeyDictionary[Delivery, float] = weakref.WeakKeyDictionary()
        self._counters: dict[tuple[str, int], Counter] = {}  # the labelled children, made once
        self._timers: dict[str, Histogram] = {}

    def arrived(self, delivery: Delivery) -> None:
        self._since[delivery] = trio.current_time()

    def rows(self, operation: str, results: list[list[object]]) -> None:
        statuses = collections.Counter(result[0] for result in results)
        for status, count in statuses.items():
            self._rows.labels(self._service, operation, str(status)).inc(count)

    def answered(self, delivery: Delivery, operation: str, status: int) -> None:
        since = self._since.pop(delivery, None)
        if operation not in self._operations:
            operation = UNKNOWN_OPERATION
        counter = self._counters.get((operation, status))
        if counter is None:
            counter = self._calls.labels(self._service, operation, str(status))
            self._counters[operation, status] = counter
        counter.inc()
        if since is not None:
            timer = self._timers.get(operation)
            if timer is None:
                timer = self._timers[operation] = self._latency.labels(self._service, operation)
            timer.observe(trio.current_time() - since)


class ServerMetrics:
    """The registry of one server, to serve at ``listen``: the call counters and latencies
    its actors' observers keep, and the gauges read at each scrape (``connections``: how many
    are open now)."""

    def __init__(
        self, listen: str, actors: Mapping[str, Actor], connections: Callable[[], int]
    ) -> None:
        client = prometheus()
        parse_listen(listen)  # a mistake is told now, not once the services have started
        self.listen = listen
        self._actors = actors
        self._connections = connections
        self.registry: CollectorRegistry = new_registry(self._collect)
        calls = client.Counter(
            "pairlink_calls",
            "Calls answered, by service, operation and the reply's status-code.",
            ["service", "operation", "status"],
            registry=self.registry,
        )
        latency = client.Histogram(
            "pairlink_call_duration_seconds",
            "Seconds from a call's arrival in its service to its answer.",
            ["service", "operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        rows = client.Counter(
            "pairlink_rows",
            "Rows of batches answered, by service, operation and the row's own status-code.",
            ["service", "operation", "status"],
            registry=self.registry,
        )
        for address, actor in actors.items():
            actor.observer = CallMetrics(address, actor.operations, calls, latency, rows)

    def _collect(self) -> Iterator[Metric]:
        yield connections_gauge(self._connections())
        for name, text, read in _GAUGES:
            family = gauge(name, text, labels=["service"])
            for address, actor in self._actors.items():
                family.add_metric([address], read(actor))
            yield family
        for name, text, read in _COUNTERS:
            total = counter(name, text, labels=["service"])
            for address, actor in self._actors.items():
                total.add_metric([address], read(actor))
            yield total


_GAUGES: tuple[tuple[str, str, Callable[[Actor], int]], ...] = (
    ("pairlink_calls_running", "Calls whose handler is running.", lambda a: a.running),
    ("pairlink_calls_queued", "Calls waiting in the mailbox for a worker.", lambda a: a.queued),
    (
        "pairlink_mailbox_held",
        "Calls the mailbox holds: queued, running, or with a reply waiting for credit.",
        lambda a: a.held,
    ),
    ("pairlink_mailbox_size", "The mailbox's bound: calls it may hold.", lambda a: a.bound),
    (
        "pairlink_credit_outstanding",
        "Link credit granted to callers and not used yet, over the service's links.",
        lambda a: a.outstanding,
    ),
)
"""The per-service gauges: name, help, and how to read it from the actor."""

_COUNTERS: tuple[tuple[str, str, Callable[[Actor], int]], ...] = (
    (
        "pairlink_credit_revoked",
        "Request links detached for holding credit past a drain (drain_timeout).",
        lambda a: a.mailbox.revoked,
    ),
    (
        "pairlink_dedup_repeats",
        "Repeated calls answered from the dedup store (or by waiting), without running.",
        lambda a: a.dedup.hits if a.dedup is not None else 0,
    ),
)
"""The per-service counters, read as the gauges are."""
