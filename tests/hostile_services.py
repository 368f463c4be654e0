"""Services the hostile-peer tests serve in a child process (``python -m pairlink serve
tests.hostile_services:...``), so the server's memory can be read from ``/proc``."""

from __future__ import annotations

from typing import Any

from pairlink import handler, service


@service("bigbox", max_concurrency=64, mailbox=50_000)
class BigBox:
    """An echo with a huge mailbox: it grants a caller 50,000 requests of credit at once, so
    a caller that never reads can pipeline that many without waiting for a flow."""

    @handler(inline=True)
    def echo(self, x: Any) -> Any:
        return x
