"""A service and its callers in one script: the shortest tour of pairlink.

Run it with ``.venv/bin/python examples/calc.py``. It serves a calculator on
127.0.0.1 (a free port), calls it over a paired link, shows a remote error, then makes 2,000
calls with 100 in flight and prints the rate.
"""

from __future__ import annotations

import time

import trio

from pairlink import RemoteError, connect, handler, open_server, service


@service("calc", max_concurrency=8)
class Calculator:
    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

    @handler("mul")
    def multiply(self, a: float, b: float) -> float:
        return a * b

    @handler(expose_errors=ZeroDivisionError)  # the caller may learn of these; not of others
    def div(self, a: float, b: float) -> float:
        return a / b


async def main() -> None:
    async with (
        open_server(Calculator, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as conn,
    ):
        print(f"serving calc at {server.url}")
        calc = await conn.service("calc")
        print("add(1, 2) =", await calc.add(1, 2))
        print("mul(2.0, 4.0) =", await calc.options(timeout=5).call("mul", 2.0, 4.0))
        try:
            await calc.div(1, 0)
        except RemoteError as exc:
            print(f"div(1, 0) failed remotely: status {exc.status}, {exc.type}: {exc.message}")

        calls, in_flight = 2000, 100
        limiter = trio.CapacityLimiter(in_flight)

        async def one(i: int) -> None:
            async with limiter:
                assert await calc.add(i, i) == 2 * i

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(calls):
                nursery.start_soon(one, i)
        elapsed = time.perf_counter() - start
        print(f"{calls} calls, {in_flight} in flight: {calls / elapsed:,.0f} calls/s")


if __name__ == "__main__":
    trio.run(main)
