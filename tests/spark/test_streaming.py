"""call_service in Structured Streaming, on real PySpark (local[2,4]) against a real service:
on a streaming DataFrame, and in the README's ``foreachBatch`` recipe, stopped mid-stream and
restarted from its checkpoint."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pairlink._rpc.batch import DEFAULT_BATCH_ROWS
from tests.spark.recorder import Served, expected
from tests.spark.test_call_service import score

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

FILES = 4
ROWS_PER_FILE = 250
ROWS = FILES * ROWS_PER_FILE
WRITTEN = 1_700_000_000  # the first input file's modification time


def write_inputs(folder: Path) -> Path:
    """``FILES`` JSON-lines files of ``ROWS_PER_FILE`` rows each (``id``, ``text``), ids
    0..ROWS-1 in file order, which is their modification times' (the order a file source
    takes them in), a second apart."""
    folder.mkdir()
    for file in range(FILES):
        ids = range(file * ROWS_PER_FILE, (file + 1) * ROWS_PER_FILE)
        lines = (json.dumps({"id": i, "text": f"row {i}"}) for i in ids)
        path = folder / f"part-{file}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (WRITTEN + file, WRITTEN + file))
    return folder


def file_stream(spark: SparkSession, folder: Path) -> DataFrame:
    """The files as a stream, one file per micro-batch."""
    reader = spark.readStream.schema("id long, text string").option("maxFilesPerTrigger", 1)
    return reader.json(str(folder))


def test_call_service_on_a_streaming_dataframe_answers_every_row(
    spark: SparkSession, recorder: Served, tmp_path: Path
) -> None:
    stream = file_stream(spark, write_inputs(tmp_path / "in"))
    scored = score(stream, recorder.url, key="id", run_id="scored-stream")
    assert scored.isStreaming
    query = (
        scored.writeStream.format("memory")
        .queryName("scored_stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert [p["numInputRows"] for p in query.recentProgress] == [ROWS_PER_FILE] * FILES
    got = spark.table("scored_stream").orderBy("id").collect()
    assert [tuple(row) for row in got] == [(i, f"row {i}", *expected(i)) for i in range(ROWS)]
    assert recorder.service.runs == dict.fromkeys(range(ROWS), 1)


STOP_AT = 1
"""The micro-batch whose calls are made and output written before the query stops: its commit
never happens, so the restarted query runs it again."""

RunId = Callable[[int], str | None]


def run_recipe(
    spark: SparkSession, recorder: Served, tmp_path: Path, run_id: RunId, stop: bool
) -> StreamingQuery:
    """The README's recipe over the input files (written on first use), to
    ``tmp_path/out/batch_id=<id>``; ``stop``: raise in batch ``STOP_AT`` once its calls ran and
    its output was written, as a crash between the batch's work and its commit would."""
    inputs = tmp_path / "in"
    if not inputs.exists():
        write_inputs(inputs)

    def enrich_batch(batch: DataFrame, batch_id: int) -> None:
        out = score(batch, recorder.url, key="id", run_id=run_id(batch_id))
        out.write.mode("overwrite").parquet(str(tmp_path / "out" / f"batch_id={batch_id}"))
        if stop and batch_id == STOP_AT:
            raise RuntimeError(f"stopped after batch {batch_id}'s calls, before its commit")

    return (
        file_stream(spark, inputs)
        .writeStream.foreachBatch(enrich_batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def stopped_and_restarted(
    spark: SparkSession, recorder: Served, tmp_path: Path, run_id: RunId
) -> None:
    """The recipe stopped in batch ``STOP_AT``, then restarted from the same checkpoint until
    the input is done."""
    first = run_recipe(spark, recorder, tmp_path, run_id, stop=True)
    with pytest.raises(StreamingQueryException, match="before its commit"):
        first.awaitTermination()
    ran = recorder.service.runs
    batches = ROWS_PER_FILE * (STOP_AT + 1)
    assert ran == dict.fromkeys(range(batches), 1)  # batch STOP_AT's calls were made
    assert (tmp_path / "out" / f"batch_id={STOP_AT}").exists()  # and its output written
    again = run_recipe(spark, recorder, tmp_path, run_id, stop=False)
    again.awaitTermination()
    replayed = [p["batchId"] for p in again.recentProgress]
    assert replayed == list(range(STOP_AT, FILES))  # the uncommitted batch ran again


def test_the_foreach_batch_recipe_restarted_from_its_checkpoint_repeats_no_effect(
    spark: SparkSession, recorder: Served, tmp_path: Path
) -> None:
    """The README's ids, ``<query>:<batch_id>`` and the row's key: the replayed batch sends the
    ids it sent before, and the service answers them from its dedup store."""
    stopped_and_restarted(spark, recorder, tmp_path, lambda batch_id: f"reviews:{batch_id}")
    assert recorder.service.runs == dict.fromkeys(range(ROWS), 1)
    # batch STOP_AT's calls, answered from the store: its rows, 256 to a message
    assert recorder.dedup_hits == math.ceil(ROWS_PER_FILE / DEFAULT_BATCH_ROWS)
    got = spark.read.parquet(str(tmp_path / "out")).orderBy("id").collect()
    assert [(r.id, r.text, r.score, r.label, r.batch_id) for r in got] == [
        (i, f"row {i}", *expected(i), i // ROWS_PER_FILE) for i in range(ROWS)
    ]


def test_without_ids_from_the_batch_id_a_restart_repeats_the_batch_effects(
    spark: SparkSession, recorder: Served, tmp_path: Path
) -> None:
    """What the recipe prevents: a fresh ``run_id`` per ``call_service`` (its default) gives
    the replayed batch new ids, and the service runs its rows a second time."""
    stopped_and_restarted(spark, recorder, tmp_path, lambda batch_id: None)
    replayed = range(STOP_AT * ROWS_PER_FILE, (STOP_AT + 1) * ROWS_PER_FILE)
    assert recorder.service.runs == {i: 2 if i in replayed else 1 for i in range(ROWS)}
    assert recorder.dedup_hits == 0
