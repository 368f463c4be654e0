"""Gateways: paired links carried between organisations (LP-11), internal addresses kept in.

``open_gateway(config)`` runs one in a block, ``run_gateway(config)`` until cancelled;
``load_config(path)`` reads the TOML file ``pairlink gateway --config`` takes.
"""

from framework.gateway.config import ConfigError, GatewayConfig, Route, load_config, parse_config
from framework.gateway.node import Gateway, open_gateway, run_gateway

__all__ = [
    "ConfigError",
    "Gateway",
    "GatewayConfig",
    "Route",
    "load_config",
    "open_gateway",
    "parse_config",
    "run_gateway",
]
