"""The peers benchmark's workload on Spark Structured Streaming, as a Spark user would build it
on this machine (run by bench/peers.py in .venv): spark_streaming.py's queries over the peers
input, in a ``local[2]`` session of Spark's defaults plus what they need (RocksDB state with
changelog checkpointing, 2 shuffle partitions, the Python workers on this interpreter), a
micro-batch every second.

``--query agg``: ``groupBy("user").agg(sum("amount"))`` in update mode, so one output row per
user updated in a micro-batch (its sum at the batch's end), not one per record;
``--query tws``: ``transformWithStateInPandas`` emitting every record's updated sum, as the
other systems do. ``--max-records-per-batch`` is ``maxOffsetsPerTrigger`` (the input is
all there at the start: without a cap the first micro-batch would take all of it);
``--time-limit`` seconds end a run that has not consumed the input by then (its figures are
then those of the batches so far, ``partial``).

Figures from the query's progress events: the first micro-batch's start (``first_record``), the
last one's end (``done``), and per micro-batch the time it spent making itself durable (the
checkpoint a Flink user would compare): ``walCommit`` (the offset log) + ``commitOffsets``
(the commit log) + the state store's ``commitTimeMs`` (RocksDB's changelog written).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: recording

import spark_streaming
from common import arguments, option, report
from pyspark.sql import SparkSession
from recording import percentiles


def main() -> None:
    query = option("query", "agg")
    cap = int(option("max-records-per-batch", str(spark_streaming.MAX_RECORDS_PER_BATCH[query])))
    time_limit = float(option("time-limit", "600"))
    args = arguments(__doc__ or "")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need confluent-kafka
    spark = SparkSession.builder.master("local[2]").appName(args.name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark_streaming.prepare(spark)
    progress = spark_streaming.ProgressLog()
    spark.streams.addListener(progress)
    sink = spark_streaming.KafkaSink(args.bootstrap, args.output)
    checkpoint = Path(args.work_dir) / "checkpoint"
    running = spark_streaming.start_query(
        spark, query, args.bootstrap, args.input, cap, checkpoint, sink
    )
    try:
        consumed = spark_streaming.wait(
            running, progress, args.records, time.monotonic() + time_limit
        )
    finally:
        running.stop()
    batches = progress.batches(running.runId)
    wall_minus_monotonic = time.time() - time.monotonic()
    report(
        {
            "first_record": spark_streaming.begins(batches[0]) - wall_minus_monotonic,
            "done": spark_streaming.ends(batches[-1]) - wall_minus_monotonic,
            "records": consumed,
            "partial": consumed < args.records,
            "batches": len(batches),
            "max_records_per_batch": cap,
            "output_records": sink.records,
            "checkpoint_durations_ms": [
                spark_streaming.duration(batch, "walCommit")
                + spark_streaming.duration(batch, "commitOffsets")
                + spark_streaming.state_commit_ms(batch)
                for batch in batches
            ],
            "batch_ms": percentiles(
                [spark_streaming.duration(batch, "triggerExecution") for batch in batches]
            ),
            "versions": {
                name: importlib.metadata.version(name) for name in ("pyspark", "confluent-kafka")
            },
        }
    )
    spark.stop()


if __name__ == "__main__":
    main()
