"""Two organisations joined by two gateways on 127.0.0.1: client -> GN -> GO -> CO (LP-11).

Organisation O runs the echo service on its container CO at the internal address
``billing.internal``; its gateway GO (``go.toml``) exposes it as ``billing``. Organisation N's
gateway GN (``gn.toml``) exposes GO's ``billing`` as its own ``billing``, so N's applications
call ``billing`` on GN and never learn where, or under which name, O serves it.

This script sets the SASL passwords the configs name (random ones, unless the variables are
set already), runs CO and both gateways in this process over real TCP on the configs' ports
(25671-25673), calls ``billing`` through GN, shows what GN refuses, and stops.
Run: ``.venv/bin/python -m examples.two_orgs.run``. For TLS between the organisations, give
GO an ``amqps://`` listen and a ``[tls]`` table, and GN's route an ``amqps://`` upstream with
``ca`` (the CA that signed GO's certificate).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path
from urllib.parse import quote

import structlog
import trio

from pairlink import AuthenticationError, LinkDetachedError, connect, hosted, open_server
from services.echo import Echo
from services.gateway import serve_gateway

HERE = Path(__file__).resolve().parent
CO_LISTEN = "amqp://127.0.0.1:25671"
INTERNAL_ADDRESS = "billing.internal"  # go.toml routes to it; nobody in N ever sees it


def set_passwords() -> str:
    """The variables gn.toml and go.toml name; returns the password of N's applications."""
    org_n = os.environ.setdefault("GO_ORG_N_PASSWORD", secrets.token_urlsafe(16))
    os.environ.setdefault("GN_UPSTREAM_PASSWORD", org_n)  # GN logs in to GO as org-n
    return os.environ.setdefault("GN_APPS_PASSWORD", secrets.token_urlsafe(16))


async def main() -> None:
    apps_password = set_passwords()
    async with (
        open_server(hosted(Echo, address=INTERNAL_ADDRESS), listen=CO_LISTEN) as co,
        trio.open_nursery() as gateways,
    ):
        go = await gateways.start(serve_gateway, HERE / "go.toml")
        gn = await gateways.start(serve_gateway, HERE / "gn.toml")
        print(f"CO {co.url} serves {INTERNAL_ADDRESS!r}")
        print(f"GO {go.url} exposes 'billing' -> CO {INTERNAL_ADDRESS!r}")
        print(f"GN {gn.url} exposes 'billing' -> GO 'billing'")

        gn_url = f"amqp://org-n-apps:{quote(apps_password, safe='')}@127.0.0.1:{gn.port}"
        async with connect(gn_url, timeout=10) as client:
            billing = await client.service("billing")
            print("billing.echo('hello') =", await billing.echo("hello"))
            print("billing.echo({'invoice': 42}) =", await billing.echo({"invoice": 42}))

            calls, in_flight = 2000, 100
            limiter = trio.CapacityLimiter(in_flight)

            async def one(i: int) -> None:
                async with limiter:
                    assert await billing.echo(i) == i

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(one, i)
            rate = calls / (time.perf_counter() - start)
            print(f"{calls} calls through GN and GO, {in_flight} in flight: {rate:,.0f} calls/s")

            for address in (INTERNAL_ADDRESS, "payroll"):
                try:
                    await client.call(address, "echo", 1)
                except LinkDetachedError as exc:
                    print(f"GN has no route {address!r}: {exc.condition}")

        try:
            async with connect(f"amqp://org-n-apps:wrong@127.0.0.1:{gn.port}"):
                pass
        except AuthenticationError as exc:
            print(f"a wrong password is refused at SASL: {exc}")
        gateways.cancel_scope.cancel()
    print("stopped")


if __name__ == "__main__":
    # warnings only: `logging.INFO` shows every connection, pair and refusal at every hop
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    trio.run(main)
