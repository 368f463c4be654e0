"""Prometheus metrics, the pieces servers and gateways share: one registry each, an HTTP
endpoint served from Trio, and the open-connections gauge.

``prometheus_client`` is optional (the ``metrics`` extra) and imported only when metrics are
asked for, so a server or gateway without them neither imports it nor pays for it. Each server
and gateway has a registry of its own, never the process-wide default one: several of them in
one process (tests, a gateway beside its services) would clash there.

Gauges (connections, calls in flight, pairs...) are read from the live objects when a scrape
asks, by collectors: they cost nothing between scrapes. The endpoint runs in the event loop,
not in ``prometheus_client``'s thread, so a collector reads its objects while nothing else
changes them (iterating a dict that another thread resizes would fail the scrape).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from pairlink._telemetry.logs import get_logger
from pairlink._version import DISTRIBUTION
from pairlink.errors import MetricsUnavailable

if TYPE_CHECKING:
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import CollectorRegistry

log = get_logger("pairlink.metrics")


def prometheus() -> ModuleType:
    """``prometheus_client``, imported now (the first time metrics are asked for), once h11
    (which parses the endpoint's HTTP, :mod:`pairlink._telemetry.metrics_http`) is known
    there too."""
    try:
        importlib.import_module("h11")
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise MetricsUnavailable(
            f"metrics need prometheus_client: pip install '{DISTRIBUTION}[metrics]'"
        ) from None


def new_registry(*collectors: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A registry of its own, with ``collectors`` (called at each scrape) registered."""
    registry: CollectorRegistry = prometheus().CollectorRegistry(auto_describe=False)
    for collect in collectors:
        registry.register(_Collector(collect))
    return registry


class _Collector:
    """A scrape-time collector: what ``collect`` returns, read when the scrape comes."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect = collect

    def describe(self) -> list[Metric]:
        return []  # nothing to check for clashes: the names are ours, and fixed


def gauge(
    name: str, text: str, *, labels: Sequence[str] = (), value: float | None = None
) -> GaugeMetricFamily:
    """A gauge read at scrape time: one ``value``, or one sample per label values added."""
    family: GaugeMetricFamily = prometheus().metrics_core.GaugeMetricFamily(
        name, text, value=value, labels=list(labels) or None
    )
    return family


def counter(name: str, text: str, *, labels: Sequence[str] = ()) -> CounterMetricFamily:
    """A counter read at scrape time (``name`` without ``_total``, which the exposition adds),
    one sample per label values added."""
    family: CounterMetricFamily = prometheus().metrics_core.CounterMetricFamily(
        name, text, labels=list(labels) or None
    )
    return family


def connections_gauge(open_connections: int) -> GaugeMetricFamily:
    """``pairlink_connections``: the AMQP connections open on the listener now."""
    return gauge("pairlink_connections", "AMQP connections open now.", value=open_connections)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464``; port 0 picks a free one; ``0.0.0.0``, every
    interface) as (host, port); ``ValueError`` saying what is wrong otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"metrics listen {text!r}: an IPv6 host goes in brackets, [::1]:9464")
    return host, int(port)
