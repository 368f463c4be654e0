"""Batched calls (pairlink._rpc.batch) over real TCP: ``proxy.map`` packs rows many to a
message, the service runs its per-row handler for each (every kind) or a vectorised one once
per batch, and each row is answered on its own, in order: a failing row fails alone, the
deadline cuts the rows it reaches, dedup answers a repeated batch from its store, metrics count
the rows. Hostile batches are refused row by row or whole, never with a crash."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import trio
import trio.testing

from pairlink import (
    CallContext,
    Limits,
    Proceed,
    RemoteError,
    blocking,
    connect,
    current_call,
    handler,
    hosted,
    open_server,
    service,
)
from pairlink._rpc import batch
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.payload import BATCH
from pairlink._server.batches import REPLY_MARGIN, row_cutoff
from pairlink.errors import CallError, RemoteTimeoutError
from pairlink.spark import serve_in_thread
from tests.scraping import scrape
from tests.service_peers import wait_for

URL = "amqp://127.0.0.1:0"


class Secret(Exception):
    """An exception whose text must stay in the service's log."""


@service("rows", max_concurrency=4, expose_errors=LookupError, dedup_window=60)
class Rows:
    def __init__(self) -> None:
        self.ran: list[int] = []
        self.columns: list[tuple[list[Any], ...]] = []
        self.arrow: list[pa.RecordBatch] = []  # the columns arrow_sum was given
        self.gate = trio.Event()

    @handler
    async def add(self, a: int, b: int = 0) -> int:
        self.ran.append(a)
        return _answer(a, a + b)

    @handler
    def times(self, a: int, b: int) -> int:  # in a thread
        self.ran.append(a)
        return _answer(a, a * b)

    @handler(inline=True)
    def neg(self, a: int) -> int:
        return _answer(a, -a)

    @handler
    async def hang_at(self, a: int, at: int) -> int:
        if a == at:
            await trio.sleep_forever()
        return a

    @handler(batch=True)
    def vsum(self, a: list[int], b: list[int]) -> list[object]:
        self.columns.append((a, b))
        if a == [99]:
            raise Secret("password=hunter2")
        if a == [98]:
            return [1, 2]  # one result too many
        return [ValueError("no") if x == 5 else x + y for x, y in zip(a, b, strict=True)]

    @handler(batch=True)
    async def vdouble(self, x: list[int]) -> list[int]:
        return [2 * v for v in x]

    @handler(batch="arrow")
    def arrow_sum(self, a: pa.Int64Array, b: pa.Int64Array) -> pa.Int64Array:
        self.arrow.append(pa.RecordBatch.from_arrays([a, b], names=["a", "b"]))
        return pc.add(a, b)

    @handler
    def whoami(self, a: object) -> str:
        return str(current_call().message_id)


UNLUCKY, MISSING, HIDDEN = -13, -14, -15
"""First arguments that make a row fail: with a CallError, an exposed type, a secret."""


def _answer(a: int, value: int) -> int:
    """A row's result, or the failure its first argument asks for."""
    if a == UNLUCKY:
        raise CallError(400, "unlucky 13", "Unlucky")
    if a == MISSING:
        raise LookupError("no such row 14")
    if a == HIDDEN:
        raise Secret("password=hunter2")
    return value


async def test_map_answers_every_row_in_order_for_every_kind_of_handler() -> None:
    async with open_server(Rows, listen=URL) as server, connect(server.url) as client:
        proxy = await client.service("rows")
        n = 1000
        assert await proxy.map("add", range(n), range(n)) == [2 * i for i in range(n)]
        assert await proxy.map("times", range(n), range(n), batch_rows=7) == [
            i * i for i in range(n)
        ]
        assert await proxy.map("neg", range(20), in_flight=1) == [-i for i in range(20)]
        assert await proxy.map("add", []) == []
        assert await proxy.map("add", range(3)) == [0, 1, 2]  # the default b


async def test_rows_are_cut_into_batches_by_rows_and_by_bytes() -> None:
    """Each batch is one message: the middleware sees one call per batch."""
    seen: list[object] = []

    async def record(call: CallContext, proceed: Proceed) -> object:
        seen.append(call.message_id)
        return await proceed()

    async with (
        open_server(Rows, listen=URL, middleware=[record]) as server,
        connect(server.url) as client,
    ):
        proxy = (await client.service("rows")).options(message_id="job")
        assert await proxy.map("add", range(50), batch_rows=7) == list(range(50))
        assert sorted(map(str, seen)) == sorted(f"job:{n}" for n in range(math.ceil(50 / 7)))
        seen.clear()
        wide = ["x" * 1000] * 10  # ~1 KiB a row: three rows to a 3 KiB batch
        got = await proxy.options(message_id="wide").map("whoami", wide, batch_bytes=3 * 1024)
        assert len(seen) == 4
        assert got == ["wide:0"] * 3 + ["wide:1"] * 3 + ["wide:2"] * 3 + ["wide:3"]


async def test_a_failing_row_fails_alone_and_says_what_the_service_discloses() -> None:
    service = Rows()
    async with open_server(hosted(service), listen=URL) as server, connect(server.url) as client:
        proxy = await client.service("rows")
        got = await proxy.map("add", [1, UNLUCKY, MISSING, HIDDEN, 2], [1] * 5, on_error="return")
        assert got[0] == 2 and got[4] == 3
        unlucky, missing, hidden = got[1:4]
        assert isinstance(unlucky, RemoteError)
        assert (unlucky.status, unlucky.type, unlucky.message) == (400, "Unlucky", "unlucky 13")
        assert isinstance(missing, RemoteError)
        assert (missing.status, missing.type, missing.message) == (
            500,
            "LookupError",
            "no such row 14",
        )
        assert isinstance(hidden, RemoteError) and hidden.status == 500
        assert hidden.ref is not None and "hunter2" not in str(hidden)
        assert service.ran.count(2) == 1  # the rows after a failure ran
        # arguments that do not fit fail their row, not the batch
        bad = await proxy.map("add", [1, 2], ["x", 3], [None, 4], on_error="return")
        assert all(isinstance(e, RemoteError) and e.status == 400 for e in bad)
        assert "too many positional arguments" in str(bad[0])
        with pytest.raises(RemoteError, match=r"\[400\] Unlucky: unlucky 13"):
            await proxy.map("add", [1, UNLUCKY, 2], [1, 1, 1])


async def test_a_vectorised_handler_takes_each_batch_as_columns() -> None:
    service = Rows()
    async with open_server(hosted(service), listen=URL) as server, connect(server.url) as client:
        proxy = await client.service("rows")
        got = await proxy.map("vsum", range(10), range(10), batch_rows=4, on_error="return")
        assert sorted(service.columns) == [
            ([0, 1, 2, 3], [0, 1, 2, 3]),
            ([4, 5, 6, 7], [4, 5, 6, 7]),
            ([8, 9], [8, 9]),
        ]
        assert [v for i, v in enumerate(got) if i != 5] == [2 * i for i in range(10) if i != 5]
        assert isinstance(got[5], RemoteError) and got[5].status == 500  # its row alone
        assert await proxy.map("vdouble", range(5)) == [0, 2, 4, 6, 8]
        # a single call is a batch of one
        assert await proxy.vsum(2, 3) == 5
        assert await proxy.vdouble(21) == 42
        assert service.columns[-1] == ([2], [3])
        # a handler that raises fails every row of its batch; a result of the wrong length
        # too, as the handler's error (undisclosed)
        for a in (99, 98):
            (failed,) = await proxy.map("vsum", [a], [0], on_error="return")
            assert isinstance(failed, RemoteError) and failed.status == 500
            assert failed.ref is not None and "hunter2" not in str(failed)


async def test_an_arrow_handler_takes_each_column_as_an_arrow_array() -> None:
    service = Rows()
    async with open_server(hosted(service), listen=URL) as server, connect(server.url) as client:
        proxy = await client.service("rows")
        assert await proxy.map("arrow_sum", range(6), range(6), batch_rows=3) == [
            0,
            2,
            4,
            6,
            8,
            10,
        ]
        assert sorted(table.column("a").to_pylist() for table in service.arrow) == [
            [0, 1, 2],
            [3, 4, 5],
        ]


async def test_the_deadline_cuts_the_row_it_reaches_and_the_rows_after_it() -> None:
    async with open_server(Rows, listen=URL) as server, connect(server.url) as client:
        proxy = (await client.service("rows")).options(timeout=0.5)
        got = await proxy.map("hang_at", [0, 1, 2, 3], [2] * 4, on_error="return")
        assert got[:2] == [0, 1]
        assert all(isinstance(e, RemoteTimeoutError) for e in got[2:])
        assert "while the row ran" in str(got[2])
        assert "before the row ran" in str(got[3])


def test_a_short_deadline_keeps_a_tenth_of_its_time_for_the_reply() -> None:
    """Rows stop starting 50 ms before the deadline, or a tenth of the time left when that is
    less: a batch given 20 ms still runs its rows for 18."""
    now = wall_time()
    assert row_cutoff(now + 10.0) == pytest.approx(now + 10.0 - REPLY_MARGIN, abs=1e-3)
    assert row_cutoff(now + 0.02) == pytest.approx(now + 0.018, abs=1e-3)
    assert row_cutoff(now - 1.0) == now - 1.0  # past already: nothing more to keep


async def test_a_repeated_batch_is_answered_from_the_dedup_store() -> None:
    service = Rows()
    async with open_server(hosted(service), listen=URL) as server:
        for _ in range(2):  # a retried job: a new connection, the same ids
            async with connect(server.url) as client:
                proxy = (await client.service("rows")).options(message_id="job-7")
                got = await proxy.map("add", range(300), range(300), on_error="return")
                assert got == [2 * i for i in range(300)]
    assert sorted(service.ran) == list(range(300))  # each row's effect once


async def test_a_batch_over_max_batch_rows_is_refused_whole() -> None:
    async with (
        open_server(Rows, listen=URL, limits=Limits(max_batch_rows=10)) as server,
        connect(server.url) as client,
    ):
        proxy = await client.service("rows")
        assert await proxy.map("add", range(20), batch_rows=10) == list(range(20))
        got = await proxy.map("add", range(11), batch_rows=11, on_error="return")
        assert all(isinstance(e, RemoteError) and e.status == 400 for e in got)
        assert "a batch of 11 rows exceeds the service's limit of 10 (max_batch_rows)" in str(
            got[0]
        )


async def _raw_batch(url: str, body: bytes, operation: str = "add") -> tuple[int | None, object]:
    async with connect(url) as client:
        reply = await client.request(
            "rows",
            [body],
            body_kind="data",
            content_type=BATCH,
            application_properties={"operation": operation},
        )
        if reply.status != 200:
            return reply.status, reply.application_properties["status-description"]
        assert isinstance(reply.body, bytes)
        return reply.status, msgpack.unpackb(reply.body, strict_map_key=False)


async def test_hostile_batches_are_refused_row_by_row_or_whole() -> None:
    async with open_server(Rows, listen=URL) as server:
        rows = [[[1, 2], {}], "not a row", [[1], {"b": 5}], [[1], {7: 1}], [[1, 2, 3], {}]]
        status, value = await _raw_batch(server.url, msgpack.packb(rows))
        assert status == 200 and isinstance(value, list)
        assert value[0] == [200, 3]
        assert value[1][0] == 400 and "envelope" in value[1][1]
        assert value[2] == [200, 6]
        assert value[3][0] == 400 and "names must be strings" in value[3][1]
        assert value[4][0] == 400 and "too many positional" in value[4][1]
        assert await _raw_batch(server.url, msgpack.packb({"a": 1})) == (
            400,
            "a pairlink batch is an array of rows",
        )
        status, why = await _raw_batch(server.url, b"\xc1")
        assert status == 400 and "not msgpack" in str(why)
        # a reply that is no batch's is each row's error, not a crash
        (wrong, _) = batch.results({"a": 1}, 2)
        assert isinstance(wrong, RemoteError) and wrong.status == batch.BAD_REPLY
        assert isinstance(batch.results([[200, 1], "x"], 2)[1], RemoteError)


async def test_rows_are_counted_in_the_metrics_by_their_own_status() -> None:
    async with (
        open_server(Rows, listen=URL, metrics_listen="127.0.0.1:0") as server,
        connect(server.url) as client,
    ):
        proxy = await client.service("rows")
        rows = [1, UNLUCKY, 2, UNLUCKY]
        await proxy.map("add", rows, [0] * 4, batch_rows=2, on_error="return")
        assert server.metrics_url is not None
        got = await scrape(server.metrics_url)
    labels = {"service": "rows", "operation": "add"}
    assert got.value("pairlink_calls_total", **labels, status="200") == 2  # two batches
    assert got.value("pairlink_rows_total", **labels, status="200") == 2
    assert got.value("pairlink_rows_total", **labels, status="400") == 2


@service("gated", mailbox=16)
class Gated:
    def __init__(self) -> None:
        self.started = trio.Event()
        self.gate = trio.Event()

    @handler
    async def hold(self, n: int) -> int:
        self.started.set()
        await self.gate.wait()
        return n


async def test_credit_counts_rows_a_batch_holds_a_slot_per_64_rows() -> None:
    """A 1,024-row batch holds all 16 slots of its mailbox while it runs (its own and 15 for
    its rows past the first 64): another caller gets no credit until it is answered, though
    the first caller's unused credit was drained for it. Counting messages alone, that
    caller's call would have come in beside it."""
    service = Gated()
    async with (
        open_server(hosted(service), listen=URL) as server,
        connect(server.url) as first,
        connect(server.url) as second,
        trio.open_nursery() as nursery,
    ):
        mailbox = server.actors["gated"].mailbox
        rows = await first.service("gated")
        one = await second.service("gated")
        answered: list[object] = []

        async def batch() -> None:
            answered.append(await rows.map("hold", range(1024), batch_rows=1024))

        async def single() -> None:
            answered.append(await one.hold(-1))

        nursery.start_soon(batch)
        await service.started.wait()
        assert mailbox.held == 16
        nursery.start_soon(single)
        await wait_for(lambda: len(mailbox.links) == 2 and mailbox.outstanding == 0)
        await trio.testing.wait_all_tasks_blocked()
        assert mailbox.held == 16  # the single call has had no credit to come with
        service.gate.set()
        await wait_for(lambda: len(answered) == 2)
        assert answered[0] == list(range(1024)) and answered[1] == -1
        await wait_for(lambda: mailbox.held == 0)


def test_batch_handlers_are_checked_when_declared() -> None:
    with pytest.raises(TypeError, match="batch takes True, False or"):
        handler(batch="lists")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"not \*args or \*\*kwargs"):

        @service("bad")
        class Bad:
            @handler(batch=True)
            def f(self, *values: int) -> list[int]:
                return list(values)


def test_a_blocking_proxy_maps_too() -> None:
    with serve_in_thread(Rows()) as server, blocking.connect(server.url) as client:
        proxy = client.service("rows")
        assert proxy.map("times", range(300), range(300)) == [i * i for i in range(300)]
        (failed,) = proxy.map("add", [UNLUCKY], on_error="return")
        assert isinstance(failed, RemoteError) and failed.status == 400


async def test_map_checks_its_arguments() -> None:
    async with open_server(Rows, listen=URL) as server, connect(server.url) as client:
        proxy = await client.service("rows")
        for bad in ("in_flight", "batch_rows", "batch_bytes"):
            with pytest.raises(ValueError, match=f"{bad} must be an int >= 1"):
                await proxy.map("add", [1], **{bad: 0})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="on_error must be"):
            await proxy.map("add", [1], on_error="column")  # type: ignore[arg-type]
