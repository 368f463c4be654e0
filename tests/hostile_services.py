"""Services for hostile peers: some served in a child process (``python -m pairlink serve
tests.hostile_services:...``), so the server's memory can be read from ``/proc``; the bank
also by the dedup tests and benchmarks.attacks' dedup-cross-caller row."""

from __future__ import annotations

from typing import Any

from pairlink import CallContext, Proceed, handler, service
from pairlink.errors import CallError


@service("bigbox", max_concurrency=64, mailbox=50_000)
class BigBox:
    """An echo with a huge mailbox: it grants a caller 50,000 requests of credit at once, so
    a caller that never reads can pipeline that many without waiting for a flow."""

    @handler(inline=True)
    def echo(self, x: Any) -> Any:
        return x


async def refuse_bob(call: CallContext, proceed: Proceed) -> object:
    if call.user == "bob":
        raise CallError(403, "bob may not")
    return await proceed()


@service("bank", dedup_window=60, middleware=[refuse_bob])
class Bank:
    """A transfer is a side effect that a repeat must not run twice, nor another caller's
    message-id hide; its middleware refuses the user bob (403)."""

    def __init__(self) -> None:
        self.transfers: list[tuple[str, int]] = []

    @handler
    def transfer(self, to: str, amount: int) -> str:
        self.transfers.append((to, amount))
        return f"sent {amount} to {to}"

    @handler
    def ran(self) -> list[tuple[str, int]]:
        """The transfers that ran (for a caller in another process)."""
        return self.transfers
