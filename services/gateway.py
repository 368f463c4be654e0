"""A gateway run from its TOML config file, for programs that embed one.

``pairlink gateway --config gn.toml`` is the command; this is the same gateway inside your own
Trio program: ``await serve_gateway("gn.toml")`` (or ``nursery.start(serve_gateway, path)``,
which returns the running :class:`~pairlink.gateway.Gateway` once it listens) runs until
cancelled, and ``main("gn.toml")`` runs it as the whole program until Ctrl-C. The config is read
(and refused with a :class:`~pairlink.errors.ConfigError` naming the line and key) before
anything listens; passwords come from the environment variables it names, or ``environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import trio

from pairlink.gateway import Gateway, load_config, run_gateway


async def serve_gateway(
    config_path: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the config at ``config_path`` and run its gateway until cancelled."""
    config = load_config(config_path, environ=environ)
    await run_gateway(config, task_status=task_status)


def main(config_path: str | os.PathLike[str]) -> None:
    """Run the gateway of ``config_path`` in a new Trio loop until interrupted."""
    trio.run(serve_gateway, config_path)
