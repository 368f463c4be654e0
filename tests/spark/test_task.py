"""The pieces of the fan-out that need no Spark session: a task's calls (run_task) over a
connection that is cut, the progress tally, reply shapes, and import hygiene."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import trio

from pairlink import handler, open_server, service
from pairlink._spark._results import Column, result_arrays, result_fields
from pairlink._spark._task import Chunk, Plan, message_ids, run_task
from pairlink._spark.background import serve_in_thread
from pairlink._spark.progress import Tally
from tests.test_client_e2e import Relay


@service("cutter", max_concurrency=64, mailbox=1024, dedup_window=60)
class Cutter:
    """Doubles ``id``; the call for ``cut_at`` cuts its caller's connection (once) as it runs,
    so its reply and those of the calls around it are lost."""

    def __init__(self, relay: Relay, cut_at: int) -> None:
        self.relay = relay
        self.cut_at = cut_at
        self.runs: Counter[int] = Counter()

    @handler
    async def double(self, id: int) -> int:
        self.runs[id] += 1
        if id == self.cut_at and self.relay.connections == 1:
            self.relay.cut()
        await trio.sleep(0.001)
        return id * 2


async def test_calls_lost_with_the_connection_are_resent_with_the_same_ids() -> None:
    relay = Relay(0)
    cutter = Cutter(relay, cut_at=700)
    async with open_server(cutter, listen="amqp://127.0.0.1:0") as server:
        relay.target_port = server.port
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            plan = Plan(
                url=f"amqp://127.0.0.1:{relay.port}",
                address="cutter",
                operation="double",
                in_flight=100,
                timeout=20.0,
                on_error="raise",
                run_id="run",
                connect_timeout=5.0,
            )
            chunks = iter(range(0, 2000, 500))

            def read() -> Chunk[range] | None:
                start = next(chunks, None)
                if start is None:
                    return None
                rows = range(start, start + 500)
                return Chunk(rows, [(i,) for i in rows], [f"run:{i}" for i in rows])

            answered = await trio.to_thread.run_sync(lambda: list(run_task(plan, read)))
            nursery.cancel_scope.cancel()
        dedup = server.actors["cutter"].dedup
        assert dedup is not None
    assert [v for chunk in answered for v in chunk.values] == [2 * i for i in range(2000)]
    assert relay.connections == 2  # cut once, reconnected once
    assert cutter.runs == dict.fromkeys(range(2000), 1)  # resent, and not run again
    assert dedup.hits >= 1  # the cut call itself ran: its resend got the kept reply


def test_message_ids_come_from_unique_non_null_keys() -> None:
    assert message_ids("run", [1, "b"], "id") == ["run:1", "run:b"]
    with pytest.raises(ValueError, match="'id' has a null"):
        message_ids("run", [1, None], "id")
    with pytest.raises(ValueError, match="'id' repeats a key"):
        message_ids("run", [1, 2, 1], "id")


def test_the_tally_keeps_the_latest_attempt_of_each_task() -> None:
    tally = Tally()
    tally.update("run", 1, 0, 0, 300, 2)
    tally.update("run", 1, 1, 0, 500, 0)
    tally.update("run", 1, 0, 1, 100, 0)  # partition 0 retried: its count starts over
    tally.update("run", 1, 0, 0, 400, 2)  # a late report of the failed attempt: ignored
    assert tally.totals() == (600, 0)


def test_a_reply_fills_the_result_columns_by_name_position_or_alone() -> None:
    names = ["score", "label"]
    assert result_fields({"label": "x", "score": 1.0, "extra": 0}, names) == [1.0, "x"]
    assert result_fields({"label": "x", "score": None}, names) == [None, "x"]
    assert result_fields([1.0, "x"], names) == [1.0, "x"]
    assert result_fields(None, names) is None
    assert result_fields(3, ["n"]) == [3]
    with pytest.raises(ValueError, match=r"^result column 'score': the reply \{'label': 'x'\}"):
        result_fields({"label": "x"}, names)
    with pytest.raises(ValueError, match=r"a reply of 1 values for 2 result columns: \[1.0\]"):
        result_fields([1.0], names)
    with pytest.raises(TypeError, match="a reply of type int for 2 result columns: 3"):
        result_fields(3, names)


def test_values_convert_only_when_nothing_is_lost_nested_ones_too() -> None:
    """What the Spark tests do not cover: widths, nesting, and big ints."""
    import pyarrow as pa

    nested = pa.struct([("a", pa.list_(pa.int32())), ("m", pa.map_(pa.string(), pa.int8()))])
    columns = [Column("n", "tinyint", pa.int8()), Column("f", "float", pa.float32())]
    columns.append(Column("t", "struct<...>", nested))
    replies = [
        [1.0, 2**24, {"a": [1, 2.0], "m": {"k": 3.0}}],  # fits: 2**24 is exact in a float
        [300, 0.1, None],
        [None, 2**24 + 1, {"a": [0.5], "m": {}}],  # two misfits: the first is told
        [None, None, {"a": [1, 2.5], "m": {}}],
        [None, None, {"a": [], "m": {"k": 3.5}}],
        [2**70, None, None],
    ]
    errors: list[str | None] = [None] * len(replies)
    arrays = result_arrays(columns, replies, errors, "row #{}".format, "column")
    assert [array.to_pylist() for array in arrays] == [
        [1, None, None, None, None, None],
        [2**24, None, None, None, None, None],
        [{"a": [1, 2], "m": [("k", 3)]}, None, None, None, None, None],
    ]
    wanted = [
        None,
        "row #1: result column 'n' (tinyint) cannot hold the int 300: ",
        "row #2: result column 'f' (float) cannot hold the int 16777217: ",
        "row #3: result column 't' (struct<...>) cannot hold the dict {'a': [1, 2.5], 'm': {}}: ",
        "row #4: result column 't' (struct<...>) cannot hold the dict {'a': [], 'm': {'k': 3.5}}: ",
        "row #5: result column 'n' (tinyint) cannot hold the int 1180591620717411303424: ",
    ]  # then Arrow's words
    assert [
        why and want and why[: len(want)] for why, want in zip(errors, wanted, strict=True)
    ] == (wanted)
    with pytest.raises(ValueError, match=r"^row #1: result column 'n' \(tinyint\)"):
        result_arrays(columns, replies, [None] * len(replies), "row #{}".format, "raise")


def test_importing_pairlink_spark_imports_neither_pyspark_nor_pyarrow() -> None:
    probe = (
        "import sys, pairlink, pairlink.spark; "
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_server_that_cannot_start_fails_serve_in_thread_at_once() -> None:
    with serve_in_thread(Tally()) as server:
        taken = f"amqp://127.0.0.1:{server.port}"
        with pytest.raises(OSError), serve_in_thread(Tally(), listen=taken):
            pytest.fail("served on a port already taken")
