"""What bench/peers/spark_streaming.py runs inside Spark's Python processes: a Kafka source as a
Python streaming data source, the running sum as a ``StatefulProcessor``, and the Kafka writer
of the ``foreachBatch`` sink. Spark ships them to its Python workers by value
(spark_streaming.py registers this module with cloudpickle): bench/peers is not on the
workers' path.

Spark has a Kafka source of its own (spark-sql-kafka), but it is a JVM connector that this
machine does not have; a Python data source over confluent-kafka is what a PySpark user without
it would write. It follows spark-sql-kafka's design: offsets are a map partition -> next offset,
``maxOffsetsPerTrigger`` caps a micro-batch (split over the partitions in proportion to what
each has left), and a micro-batch reads one Spark partition per Kafka partition with records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# confluent-kafka's classes come from its C extension (module ``cimpl``), which cloudpickle
# cannot find by name: pickling this module by value would copy them, and fail. Referred to
# through the package they are looked up where they are used.
import confluent_kafka as kafka
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from pyspark.sql.types import StructType

from sparkpoint.common.kafka import consumer_config, true_end_offset

SOURCE_NAME = "sparkpoint_kafka_json"
"""The name queries give ``spark.readStream.format``."""

RECORD_SCHEMA = "user string, amount bigint"
"""The source's rows: the JSON values of the input topic."""

ARROW_SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])
"""`RECORD_SCHEMA` as Arrow: `KafkaStreamReader.read` yields Arrow batches, which Spark takes
as they are (tuples it would convert one row at a time)."""

CONSUME_MAX = 10_000
"""Records per ``Consumer.consume`` call, and so per Arrow batch handed to Spark."""

READ_STALL_S = 30.0
"""A read task fails when its partition yields nothing for this long: the records it was planned
over are in the topic, so a silent broker means something is wrong."""

PRODUCE_FLUSH_S = 60.0
"""How long a sink task waits for the broker to acknowledge what it produced."""

SINK_PRODUCER = {
    "client.id": "spark-peer-sink",
    "acks": "all",
    "linger.ms": 5,
    # librdkafka's default, stated: an idempotent producer waits for its producer id before its
    # first send, and the embedded broker answers it after 0.5-1 s (measured), in every task
    # (each makes a producer of its own); duplicates are allowed anyway
    "enable.idempotence": False,
}
"""The sink's producer, as a ``foreachBatch`` user would configure it for at-least-once."""


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition of a micro-batch: offsets [start, end) of one Kafka partition."""

    partition: int
    start: int
    end: int


class KafkaJsonSource(DataSource):
    """``spark.readStream.format("sparkpoint_kafka_json")`` with options ``bootstrap``,
    ``topic`` and, optionally, ``maxOffsetsPerTrigger``: the JSON values ``{"user", "amount"}``
    of every partition of the topic, from its start."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return RECORD_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        limit = self.options.get("maxOffsetsPerTrigger")
        return KafkaStreamReader(
            self.options["bootstrap"], self.options["topic"], int(limit) if limit else None
        )


class KafkaStreamReader(DataSourceStreamReader):
    """Offsets are ``{"<partition>": <next offset>}`` (JSON object keys are strings).

    The planning methods run in one long-lived Python process per query and share a consumer
    there; ``read`` runs in the executors' Python workers on a pickled copy of this reader
    (taken before the consumer exists) with a consumer of its own."""

    def __init__(self, bootstrap: str, topic: str, max_records: int | None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_records = max_records
        self._consumer: kafka.Consumer | None = None
        self._ends: dict[int, tuple[int, int]] = {}
        """Per partition, the last high watermark seen and the true end it gave."""

    def initialOffset(self) -> dict[str, int]:
        """Every partition's low watermark: the topic from its start."""
        consumer = self._planning_consumer()
        partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        starts = {}
        for p in sorted(partitions):
            low, _ = consumer.get_watermark_offsets(
                kafka.TopicPartition(self.topic, p), timeout=10, cached=False
            )
            starts[str(p)] = low
        return starts

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Every partition's end, or less under a `ReadMaxRows` limit (`capped`). Spark asks
        with `getDefaultReadLimit`'s limit, or with `ReadAllAvailable` where a trigger wants
        everything (``availableNow``)."""
        ends = {p: self._true_end(int(p)) for p in start}
        if not isinstance(limit, ReadMaxRows):
            return ends
        return capped(start, ends, limit.max_rows)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[OffsetRange]:
        return [
            OffsetRange(int(p), start.get(p, 0), stop)
            for p, stop in end.items()
            if stop > start.get(p, 0)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Exactly the records of ``partition``'s range, as Arrow batches parsed from the JSON
        values in one call per batch. The broker may hand over records past the range's end (a
        fetch returns whole batches): they are dropped."""
        assert isinstance(partition, OffsetRange)
        consumer = kafka.Consumer(consumer_config(self.bootstrap, client_id="spark-peer-read"))
        try:
            consumer.assign(
                [kafka.TopicPartition(self.topic, partition.partition, partition.start)]
            )
            position = partition.start
            last_record = time.monotonic()
            while position < partition.end:
                values: list[bytes] = []
                for message in consumer.consume(min(CONSUME_MAX, partition.end - position), 1.0):
                    error = message.error()
                    if error is not None:
                        if error.code() == kafka.KafkaError._PARTITION_EOF:
                            continue
                        raise kafka.KafkaException(error)
                    offset = message.offset()
                    assert offset is not None  # a record has one
                    if offset >= partition.end:
                        position = partition.end
                        break
                    values.append(message.value() or b"")
                    position = offset + 1
                if values:
                    last_record = time.monotonic()
                    yield from parsed(values)
                elif time.monotonic() - last_record > READ_STALL_S:
                    raise TimeoutError(
                        f"{self.topic}[{partition.partition}]: nothing at offset {position} "
                        f"(range ends at {partition.end}) for {READ_STALL_S:.0f} s"
                    )
        finally:
            consumer.close()

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _planning_consumer(self) -> kafka.Consumer:
        if self._consumer is None:
            self._consumer = kafka.Consumer(
                consumer_config(self.bootstrap, client_id="spark-peer-plan")
            )
        return self._consumer

    def _true_end(self, partition: int) -> int:
        """The offset after the partition's last record. The embedded broker's high watermark
        is its last batch's base offset + 1, so `true_end_offset` reads that batch (tens of
        milliseconds); its answer is kept until the high watermark moves."""
        consumer = self._planning_consumer()
        _, high = consumer.get_watermark_offsets(
            kafka.TopicPartition(self.topic, partition), timeout=10, cached=False
        )
        known = self._ends.get(partition)
        if known is None or known[0] != high:
            known = (high, true_end_offset(consumer, self.topic, partition))
            # it leaves the consumer fetching, and the broker answers the next watermark
            # request behind that fetch's wait (50 ms a partition, measured)
            consumer.unassign()
            self._ends[partition] = known
        return known[1]


def capped(start: dict[str, int], ends: dict[str, int], max_records: int) -> dict[str, int]:
    """``ends``, or, when more than ``max_records`` lie between ``start`` and ``ends``, ends
    that take ``max_records`` from the partitions in proportion to what each has left (as
    spark-sql-kafka splits ``maxOffsetsPerTrigger``)."""
    left = {p: max(0, end - start[p]) for p, end in ends.items()}
    available = sum(left.values())
    if available <= max_records:
        return ends
    taken = {p: n * max_records // available for p, n in left.items()}
    # the rounding remainder goes to the partitions with the most left
    for p in sorted(left, key=lambda p: left[p] - taken[p], reverse=True):
        if sum(taken.values()) >= max_records:
            break
        taken[p] += 1
    return {p: start[p] + taken[p] for p in ends}


def parsed(values: list[bytes]) -> list[pa.RecordBatch]:
    """JSON values as Arrow batches of `ARROW_SCHEMA`, parsed by Arrow in one call."""
    table = pa_json.read_json(
        pa.BufferReader(b"\n".join(values)),
        parse_options=pa_json.ParseOptions(explicit_schema=ARROW_SCHEMA),
    )
    return list(table.select(ARROW_SCHEMA.names).to_batches())


class RunningSum(StatefulProcessor):
    """``transformWithStateInPandas``: the running sum of ``amount`` per ``user`` in a
    ``ValueState``, and every record's updated sum as an output row (what
    bench/peers/sparkpoint_job.py's ``RunningSum`` emits)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.total: ValueState = handle.getValueState("sum", "sum bigint")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        stored = self.total.get()
        base = int(stored[0]) if stored is not None else 0
        outputs = []
        for frame in rows:
            sums = frame["amount"].cumsum() + base
            base = int(sums.iloc[-1])
            outputs.append(pd.DataFrame({"user": frame["user"], "sum": sums}))
        self.total.update((base,))
        yield from outputs

    def close(self) -> None:
        """Nothing to release: the state variables belong to Spark."""


PRODUCED_SCHEMA = pa.schema([("records", pa.int64())])
"""`produce_batches`' output; Spark's DDL for it is ``records bigint``."""


def produce_batches(
    bootstrap: str, topic: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function: produces each row's ``key`` and ``value`` (strings) to
    ``topic``, waits for the broker's acknowledgements, then yields one row with the count.
    A task's failure, or a record the broker refused, fails the micro-batch, which Spark runs
    again: at least once."""
    failures: list[kafka.KafkaError] = []

    def delivered(error: kafka.KafkaError | None, _: kafka.Message) -> None:
        if error is not None:
            failures.append(error)

    producer = kafka.Producer(SINK_PRODUCER | {"bootstrap.servers": bootstrap})
    produced = 0
    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        produced += batch.num_rows
        producer.poll(0)
    undelivered = producer.flush(PRODUCE_FLUSH_S)
    if undelivered or failures:
        raise RuntimeError(
            f"{topic}: {undelivered} records not acknowledged, {len(failures)} refused "
            f"({failures[0] if failures else 'no error'})"
        )
    yield pa.RecordBatch.from_pydict({"records": [produced]}, schema=PRODUCED_SCHEMA)
