"""Gateways: paired links carried between organisations (LP-11), internal addresses kept in.

``open_gateway(config)`` runs one for the duration of a block, ``run_gateway(config)`` until
cancelled; ``load_config(path)`` reads the TOML file ``pairlink gateway --config`` takes and
``parse_config(text)`` the same text from memory (a mistake raises
:class:`pairlink.errors.ConfigError` naming the line and key).
"""

from pairlink._gateway.config import GatewayConfig, Route, load_config, parse_config
from pairlink._gateway.node import Gateway, open_gateway, run_gateway

__all__ = [
    "Gateway",
    "GatewayConfig",
    "Route",
    "load_config",
    "open_gateway",
    "parse_config",
    "run_gateway",
]
