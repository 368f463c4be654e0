"""The public API exactly as the README and the issue show it, over real TCP."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pairlink._amqp
from pairlink import RemoteError, connect, handler, open_server, service


@service("calc")
class Calculator:
    @handler
    async def add(self, a: int, b: int) -> int:
        return a + b

    @handler("mul")
    def multiply(self, a: float, b: float) -> float:
        return a * b


async def test_the_readme_example() -> None:
    async with (
        open_server(Calculator, listen="amqp://127.0.0.1:0") as server,
        connect(server.url) as conn,
    ):
        calc = await conn.service("calc")
        assert await calc.add(1, 2) == 3
        assert await calc.options(timeout=5).call("mul", 2.0, 4.0) == 8.0
        with pytest.raises(RemoteError) as exc:
            await calc.call("div", 1, 0)
        assert exc.value.status == 404


def test_the_sans_io_core_imports_no_io_and_no_clock() -> None:
    """pairlink._amqp never imports trio, sockets, structlog or a clock (DESIGN.md)."""
    forbidden = {"trio", "socket", "ssl", "structlog", "time", "asyncio", "selectors"}
    core = Path(pairlink._amqp.__file__).parent
    found = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert len(list(core.glob("*.py"))) > 10
    assert found == []
