"""Spark Structured Streaming on bench/state.py's workload, for comparison with sparkpoint: a
running sum of ``amount`` per ``user`` over a Kafka topic of JSON values, every updated sum
written to Kafka, as a Spark user would build it:

- source: a Python streaming data source over confluent-kafka (spark_streaming_source.py: this
  machine has no spark-sql-kafka), ``maxOffsetsPerTrigger`` records per micro-batch at most;
- state: RocksDB with changelog checkpointing, 2 shuffle partitions (``local[2]``), a
  micro-batch every second (``processingTime``), each micro-batch a checkpoint;
- the job, ``query``: ``"agg"``, ``groupBy("user").agg(sum("amount"))`` in update mode (one
  row per user updated in a micro-batch, with its sum at the batch's end); or ``"tws"``,
  ``transformWithStateInPandas`` with a ``StatefulProcessor`` keeping the sum in a
  ``ValueState`` and emitting every record's updated sum (as sparkpoint's job does);
- sink: ``foreachBatch`` producing each micro-batch's rows, ``{"user", "sum"}`` JSON values
  keyed by user, with a confluent-kafka producer in the executors' Python workers. At least
  once: a micro-batch run again after a failure writes its rows again (Spark's own Kafka sink
  gives no more).

``run`` takes a session its caller made (``spark_conf()`` lists the settings this module needs;
it sets them on the session too, as all of them may change at run time) and an input topic that
holds ``preload`` records, every key once, then updates up to ``total`` (bench/state.py's
``fill``). It runs the query until it consumed ``total`` records, or ``time_limit_s`` passed
(then the figures are those so far, with ``"partial": true``), stops it, and measures a restart.
Import it with bench/ and bench/peers/ on ``sys.path`` (bench/peers.py shadows the directory as
a package).

Figures, from the queries' progress events (their batch ``timestamp`` is the trigger's start):

- ``records_per_second``: ``update_phase``, the records of the micro-batches that began after
  ``preload`` records were in, over the time from the first such batch's start to the last
  one's end; ``overall``, every record from the first batch's start to the last one's end
  (``startup_s``, query start to first batch, left out). A micro-batch that ends within the
  trigger interval waits for the next trigger, so a rate is Spark's own only when
  ``update_phase_busy``, the share of that time spent in micro-batches, is near 1; else it is
  about ``max_records_per_batch`` a second, and the cap should be raised;
- ``batch_ms``: per update-phase micro-batch, p50/p99 of ``triggerExecution`` and of its
  parts: ``walCommit`` (the offset log), ``commitOffsets`` (the commit log), ``addBatch``
  (the batch's jobs: source read, shuffle, state, sink) and the state operator's
  ``commitTimeMs`` (the RocksDB commit: its changelog written to the checkpoint location);
- ``state_bytes_per_batch``: per update-phase micro-batch, the bytes it added under the
  checkpoint location's ``state/``: the changelogs ``<version>.changelog`` of its version
  (batch id + 1) in every state partition, and the snapshots ``<version>.zip`` that Spark's
  maintenance thread uploads in the background (with the ``SSTs/`` files they were the first
  to reference). Files are listed every 0.5 s during the run: maintenance deletes old versions;
- ``state_rows`` and ``state_memory_bytes``: the state operator's ``numRowsTotal`` and
  ``memoryUsedBytes`` after the last batch;
- ``peak_rss_bytes``: this process and all its descendants (Spark's JVM and Python workers; an
  embedded broker this process started too), sampled every 0.5 s;
- ``restore_s``: the same query started again on the same checkpoint location with no new
  input, until it reports waiting for data: its offset and commit logs read, the source's Python
  process started, the latest offsets asked. Spark loads state lazily, in the first micro-batch
  that has data, so this does not load the RocksDB state.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import time
import zipfile
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import spark_streaming_source as source
from confluent_kafka.admin import NewTopic
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery
from recording import percentiles, process_tree, resident_bytes

from sparkpoint.common.kafka import make_admin

QUERIES = ("agg", "tws")
TRIGGER = "1 second"
MAX_RECORDS_PER_BATCH = {"agg": 500_000, "tws": 20_000}
"""``maxOffsetsPerTrigger`` by default: the topic is full before the query starts, and without a
cap the first micro-batch would take all of it, leaving no update phase to measure. Each makes
micro-batches longer than the trigger interval on this machine (see ``update_phase_busy``), so
the rate is Spark's own: at 200,000 agg's micro-batches over 10,000 keys took about the 1 s
trigger (175,000 records/s, bounded by the cap); tws did 2,900-3,900 records/s at 20,000."""
OUTPUT_PARTITIONS = 4
SAMPLE_S = 0.5
WAITING_FOR_DATA = "Waiting for data to arrive"
"""``StreamingQuery.status["message"]`` once a trigger found nothing new."""
STATE_FILE = re.compile(r"(\d+)(?:_[^.]*)?\.(changelog|zip)")
"""RocksDB's files per state version: ``<version>[_<checkpoint id>].changelog|zip``."""


def spark_conf() -> dict[str, str]:
    """The Spark settings the queries need: RocksDB state with changelog checkpointing, and 2
    shuffle (so state) partitions for ``local[2]``. All are SQL settings `run` also sets on the
    session; a query keeps the values of its first start in its checkpoint."""
    return {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.shuffle.partitions": "2",
    }


def run(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    preload: int,
    total: int,
    query: str,
    root: Path,
    time_limit_s: float,
    max_records_per_batch: int | None = None,
) -> dict[str, Any]:
    """Runs ``query`` (one of `QUERIES`) over ``topic`` until it consumed ``total`` records or
    ``time_limit_s`` passed, at most ``max_records_per_batch`` records a micro-batch (by default
    the query's `MAX_RECORDS_PER_BATCH`), writing to ``<topic>-spark-<query>`` (created here)
    with its checkpoint under ``root``; returns the figures of the module docstring and prints
    them on one line."""
    if query not in QUERIES:
        raise ValueError(f"query must be one of {QUERIES}, not {query!r}")
    if query == "tws" and not has_protobuf():
        # else the query fails in its first micro-batch, with Spark's worker "crashed"
        raise RuntimeError(
            "transformWithStateInPandas needs protobuf in this interpreter, which Spark's "
            "Python workers run: pip install 'protobuf>=6.33.5,<7' (the version PySpark 4.3's "
            "generated code was made with)"
        )
    cap = max_records_per_batch or MAX_RECORDS_PER_BATCH[query]
    prepare(spark)
    output = f"{topic}-spark-{query}"
    admin = make_admin(bootstrap)
    admin.create_topics([NewTopic(output, OUTPUT_PARTITIONS, 1)])[output].result(30)
    checkpoint = root / f"spark-{query}-checkpoint"
    sink = KafkaSink(bootstrap, output)

    def start() -> StreamingQuery:
        return start_query(spark, query, bootstrap, topic, cap, checkpoint, sink)

    progress = ProgressLog()
    spark.streams.addListener(progress)
    sampler = Sampler(checkpoint / "state")
    try:
        started = time.time()
        running = start()
        try:
            consumed = wait(running, progress, total, time.monotonic() + time_limit_s)
        finally:
            running.stop()
            sampler.stop()
        # a partial run's restart would go on with the input left, not restore
        restore = None if consumed < total else restore_seconds(start, progress)
    finally:
        sampler.stop()
        spark.streams.removeListener(progress)
    figures = summary(progress.batches(running.runId), preload, started, sampler) | {
        "query": query,
        "partial": consumed < total,
        "records": consumed,
        "max_records_per_batch": cap,
        "output_records": sink.records,
        "peak_rss_bytes": sampler.peak_rss,
        "restore_s": restore,
    }
    print(one_line(figures))
    return figures


def prepare(spark: SparkSession) -> None:
    """Sets `spark_conf` on the session and registers the Kafka source (its module pickled by
    value: the workers do not import it from bench/)."""
    for key, value in spark_conf().items():
        spark.conf.set(key, value)
    cloudpickle.register_pickle_by_value(source)  # type: ignore[no-untyped-call]
    spark.dataSource.register(source.KafkaJsonSource)


def state_commit_ms(batch: dict[str, Any]) -> int:
    """A micro-batch's state store commits (RocksDB's changelog written), over its operators."""
    return sum(int(op["commitTimeMs"]) for op in batch["stateOperators"])


def has_protobuf() -> bool:
    try:
        return importlib.util.find_spec("google.protobuf") is not None
    except ModuleNotFoundError:  # no google namespace at all
        return False


class KafkaSink:
    """The ``foreachBatch`` function: each micro-batch's ``(user, sum)`` rows as JSON values
    keyed by user, produced to ``topic`` by the executors (`source.produce_batches`); counts
    them in ``records``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.write = partial(source.produce_batches, bootstrap, topic)
        self.records = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.select(
            F.col("user").alias("key"), F.to_json(F.struct("user", "sum")).alias("value")
        )
        produced = rows.mapInArrow(self.write, "records bigint").collect()
        self.records += sum(row.records for row in produced)


def start_query(
    spark: SparkSession,
    query: str,
    bootstrap: str,
    topic: str,
    max_records_per_batch: int,
    checkpoint: Path,
    sink: KafkaSink,
) -> StreamingQuery:
    records = (
        spark.readStream.format(source.SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("maxOffsetsPerTrigger", str(max_records_per_batch))
        .load()
    )
    users = records.groupBy("user")
    if query == "agg":
        sums = users.agg(F.sum("amount").alias("sum"))
    else:
        sums = users.transformWithStateInPandas(
            source.RunningSum(), "user string, sum bigint", outputMode="Update", timeMode="None"
        )
    return (
        sums.writeStream.outputMode("update")
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(sink)
        .start()
    )


def wait(running: StreamingQuery, progress: ProgressLog, total: int, deadline: float) -> int:
    """Waits until ``running`` consumed ``total`` records or ``deadline`` (monotonic) passed;
    returns the records consumed. A query that stops on its own raises its exception."""
    consumed = 0
    while consumed < total and time.monotonic() < deadline:
        time.sleep(0.2)
        if not running.isActive:
            raise RuntimeError(f"query {running.runId} stopped: {running.exception()}")
        consumed = sum(batch["numInputRows"] for batch in progress.batches(running.runId))
    return consumed


def restore_seconds(start: Callable[[], StreamingQuery], progress: ProgressLog) -> float:
    """Seconds from starting the query again on its checkpoint until it reports waiting for
    data, or finishes a micro-batch (there should be none: nothing new came in)."""
    began = time.monotonic()
    again = start()
    try:
        while again.status["message"] != WAITING_FOR_DATA and not progress.batches(again.runId):
            time.sleep(0.01)
            if not again.isActive:
                raise RuntimeError(f"restarted query stopped: {again.exception()}")
        return round(time.monotonic() - began, 2)
    finally:
        again.stop()


class ProgressLog(StreamingQueryListener):
    """Every progress event of every query, as dicts (Spark's JSON), kept by run id."""

    def __init__(self) -> None:
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        """The run's micro-batches that had input, in order (the events of idle triggers,
        which repeat the last batch id, are left out)."""
        with self._lock:
            events = list(self._events.get(run_id, []))
        return [event for event in events if event["numInputRows"] > 0]

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        """Nothing to keep: progress events carry the query's ids."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = json.loads(event.progress.json)
        with self._lock:
            self._events.setdefault(progress["runId"], []).append(progress)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        """Nothing to keep: an idle trigger processed nothing."""

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        """Nothing to keep: `wait` sees a query stop on its own."""


class Sampler:
    """Every `SAMPLE_S`: the resident set of this process and its descendants (kept: the
    largest), and the size of every file under ``state`` (kept: each file's last size; a
    snapshot's list of ``SSTs/`` files is read when it appears, as Spark deletes old ones)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.peak_rss = 0
        self.files: dict[Path, int] = {}
        self.snapshots: dict[Path, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="spark-peer-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops sampling after one last sample (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        while True:
            self.peak_rss = max(self.peak_rss, resident_bytes(process_tree()))
            for path in self.state.rglob("*"):
                try:
                    if path.is_file():
                        self.files[path] = path.stat().st_size
                        if path.suffix == ".zip" and path not in self.snapshots:
                            self.snapshots[path] = snapshot_sst_files(path)
                except FileNotFoundError:  # deleted by Spark's maintenance since listed
                    continue
            if self._stop.wait(SAMPLE_S):
                return

    def bytes_by_version(self) -> dict[int, int]:
        """The bytes each state version added, over all operators and partitions: its
        changelogs and snapshots, the ``SSTs/`` files its snapshots are the first to list, and
        the checksum files the local file system writes beside each."""
        added: dict[int, int] = {}
        for path in self.files:
            matched = STATE_FILE.fullmatch(path.name)
            if matched is not None:
                version = int(matched.group(1))
                added[version] = added.get(version, 0) + self._written(path)
        listed: set[Path] = set()
        for path, names in sorted(self.snapshots.items(), key=lambda item: version_of(item[0])):
            for name in names:
                sst = path.parent / "SSTs" / name
                if sst not in listed and sst in self.files:
                    listed.add(sst)
                    added[version_of(path)] += self._written(sst)
        return added

    def _written(self, path: Path) -> int:
        return self.files[path] + self.files.get(path.with_name(f".{path.name}.crc"), 0)


def version_of(snapshot: Path) -> int:
    matched = STATE_FILE.fullmatch(snapshot.name)
    assert matched is not None, snapshot
    return int(matched.group(1))


def snapshot_sst_files(snapshot: Path) -> list[str]:
    """The ``SSTs/`` file names a RocksDB snapshot's metadata lists: its first line is the
    format version, its second the JSON of the checkpoint's files."""
    try:
        with zipfile.ZipFile(snapshot) as archive:
            lines = archive.read("metadata").decode().splitlines()
    except (OSError, KeyError, zipfile.BadZipFile):  # gone, or not a snapshot
        return []
    return [str(entry["dfsSstFileName"]) for entry in json.loads(lines[1]).get("sstFiles", [])]


def summary(
    batches: list[dict[str, Any]], preload: int, started: float, sampler: Sampler
) -> dict[str, Any]:
    """The rates, batch durations, state bytes and sizes of the module docstring."""
    if not batches:
        return {"batches": 0}
    update: list[dict[str, Any]] = []
    before = 0
    for batch in batches:
        if before >= preload:
            update.append(batch)
        before += batch["numInputRows"]
    last = batches[-1]
    written = sampler.bytes_by_version()
    state = last["stateOperators"]
    return {
        "batches": len(batches),
        "update_phase_batches": len(update),
        "update_phase_records": sum(int(batch["numInputRows"]) for batch in update),
        "startup_s": round(begins(batches[0]) - started, 2),
        "records_per_second": {
            "update_phase": rate(update),
            "overall": rate(batches),
        },
        "update_phase_busy": busy(update),
        "batch_ms": {
            part: percentiles([duration(batch, part) for batch in update])
            for part in ("triggerExecution", "walCommit", "commitOffsets", "addBatch")
        }
        | {"state_commit": percentiles([state_commit_ms(batch) for batch in update])},
        "state_bytes_per_batch": percentiles(
            [written.get(batch["batchId"] + 1, 0) for batch in update]
        ),
        "state_bytes_total": sum(written.values()),
        "state_rows": sum(op["numRowsTotal"] for op in state),
        "state_memory_bytes": sum(op["memoryUsedBytes"] for op in state),
    }


def begins(batch: dict[str, Any]) -> float:
    """The batch's trigger start, epoch seconds."""
    return datetime.fromisoformat(batch["timestamp"]).timestamp()


def ends(batch: dict[str, Any]) -> float:
    return begins(batch) + duration(batch, "triggerExecution") / 1000


def duration(batch: dict[str, Any], part: str) -> int:
    return int(batch["durationMs"].get(part, 0))


def rate(batches: list[dict[str, Any]]) -> int | None:
    """Records per second from the first batch's start to the last one's end."""
    if not batches:
        return None
    seconds = ends(batches[-1]) - begins(batches[0])
    return round(sum(int(batch["numInputRows"]) for batch in batches) / seconds)


def busy(batches: list[dict[str, Any]]) -> float | None:
    """The share of the time from the first batch's start to the last one's end spent in
    batches: below 1 when batches ended before the next trigger was due."""
    if not batches:
        return None
    spent = sum(duration(batch, "triggerExecution") for batch in batches) / 1000
    return round(spent / (ends(batches[-1]) - begins(batches[0])), 3)


def one_line(figures: dict[str, Any]) -> str:
    rates = figures.get("records_per_second", {})
    ms = figures.get("batch_ms", {})
    written = figures.get("state_bytes_per_batch", {})
    return (
        f"spark {figures['query']}{' (partial)' if figures['partial'] else ''}: "
        f"{figures['records']:,} records in {figures['batches']} batches, "
        f"update phase {rates.get('update_phase')} records/s, overall {rates.get('overall')} "
        f"records/s; batch p50/p99 {ms.get('triggerExecution', {}).get('p50')}/"
        f"{ms.get('triggerExecution', {}).get('p99')} ms (state commit "
        f"{ms.get('state_commit', {}).get('p50')}/{ms.get('state_commit', {}).get('p99')} ms); "
        f"state written per batch p50/p99 {written.get('p50', 0) / 1e6:.2f}/"
        f"{written.get('p99', 0) / 1e6:.2f} MB; {figures.get('state_rows')} state rows; "
        f"peak RSS {figures['peak_rss_bytes'] / 2**20:.0f} MiB; restore {figures['restore_s']} s"
    )
