"""A gateway's Prometheus metrics (``metrics_listen`` in its config, ``pairlink gateway
--metrics-listen``): its connections, the pairs it carries, and whether each route's next hop
is connected. All are read from the live gateway at each scrape: relaying costs nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from pairlink._gateway.pairs import PairBudget
from pairlink._gateway.replicas import RouteReplicas
from pairlink._telemetry.metrics import connections_gauge, gauge, new_registry, parse_listen

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry


class GatewayMetrics:
    """The registry of one gateway, to serve at ``listen``: ``connections`` says how many
    inbound connections are open, ``pairs`` what is carried, ``upstreams`` each route's next
    hop (by public address: one series per replica)."""

    def __init__(
        self,
        listen: str,
        *,
        connections: Callable[[], int],
        pairs: PairBudget,
        upstreams: Mapping[str, RouteReplicas],
    ) -> None:
        parse_listen(listen)  # a mistake is told now, not once the gateway has started
        self.listen = listen
        self._connections = connections
        self._pairs = pairs
        self._upstreams = upstreams
        self.registry: CollectorRegistry = new_registry(self._collect)

    def _collect(self) -> Iterator[Metric]:
        yield connections_gauge(self._connections())
        yield gauge(
            "pairlink_gateway_pairs", "Pairs the gateway carries now.", value=self._pairs.used
        )
        yield gauge(
            "pairlink_gateway_pairs_max",
            "Pairs the gateway carries at most (max_pairs).",
            value=self._pairs.limit,
        )
        connected = gauge(
            "pairlink_gateway_upstream_connected",
            "1 while the route's next hop is connected, else 0.",
            labels=["route", "upstream"],
        )
        for public, replicas in self._upstreams.items():
            for upstream in replicas.upstreams:
                connected.add_metric([public, upstream.where], 1 if upstream.up else 0)
        yield connected
