"""The two-organisation chain of LP-11 on 127.0.0.1, each part in a process of its own.

Organisation O serves a service on its container CO at an internal address; its gateway GO
exposes it under a public one; organisation N's gateway GN exposes GO's public address to N's
applications, which log in to GN as ``apps``. ``org_chain(service, public=...)`` starts CO, GO
and GN (port 0 each, random passwords), yields the URL N's applications use, and stops all
three when the block ends. Separate processes, so the service and the two gateways each get a
core of their own where the machine has one, as they would in production.
"""

from __future__ import annotations

import logging
import multiprocessing
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from multiprocessing.connection import Connection
from typing import Any

import structlog
import trio

from pairlink import hosted, open_server
from pairlink.gateway import GatewayConfig, Route, open_gateway

START_TIMEOUT = 60.0


def _serve(what: str, spec: Any, pipe: Connection, log_level: int) -> None:
    """A child process: serve ``spec`` (a service, or a gateway's config), send the port up
    ``pipe``, and run until the parent closes its end."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(log_level))

    async def main() -> None:
        async with (
            open_server(spec, listen="amqp://127.0.0.1:0")
            if what == "service"
            else open_gateway(spec)
        ) as running:
            pipe.send(running.port)
            await trio.to_thread.run_sync(_until_closed, pipe, abandon_on_cancel=True)

    trio.run(main)


def _until_closed(pipe: Connection) -> None:
    with suppress(EOFError):
        pipe.recv()


@contextmanager
def _child(what: str, spec: Any, log_level: int) -> Iterator[int]:
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(what, spec, theirs, log_level), name=f"pairlink-{what}", daemon=True
    )
    process.start()
    theirs.close()
    try:
        if not ours.poll(START_TIMEOUT):
            raise RuntimeError(f"the {what} process did not start within {START_TIMEOUT} s")
        yield int(ours.recv())
    finally:
        ours.close()  # the child's cue to stop
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


@contextmanager
def org_chain(service: object, *, public: str, log_level: int = logging.WARNING) -> Iterator[str]:
    """CO serving ``service`` internally, GO and GN in front of it; yields N's URL to GN.
    The three processes log from ``log_level`` on."""
    internal = f"{public}.internal-{secrets.token_hex(4)}"  # nobody in N ever sees it
    org_n_password = secrets.token_urlsafe(16)
    apps_password = secrets.token_urlsafe(16)
    with ExitStack() as stack:
        co = stack.enter_context(_child("service", hosted(service, address=internal), log_level))
        go = GatewayConfig(
            listen="amqp://127.0.0.1:0",
            container_id="go",
            users={"org-n": org_n_password},
            routes=(Route(public, f"amqp://127.0.0.1:{co}", internal),),
        )
        go_port = stack.enter_context(_child("gateway", go, log_level))
        gn = GatewayConfig(
            listen="amqp://127.0.0.1:0",
            container_id="gn",
            users={"apps": apps_password},
            routes=(
                Route(
                    public,
                    f"amqp://127.0.0.1:{go_port}",
                    public,
                    user="org-n",
                    password=org_n_password,
                    allow=frozenset({"apps"}),
                ),
            ),
        )
        gn_port = stack.enter_context(_child("gateway", gn, log_level))
        yield f"amqp://apps:{apps_password}@127.0.0.1:{gn_port}"
