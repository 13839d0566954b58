"""Where a job's records come from and go to: Kafka topics or files in, Kafka topics or files
out, with Flink's delivery guarantees. Part of the job API (`sparkpoint.agent.job` names them
all)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkpoint.agent.formats import JsonValues, ValueFormat
from sparkpoint.agent.sources.backlog import LIVE
from sparkpoint.agent.time.strategy import WatermarkStrategy
from sparkpoint.common.options import parse_duration

DEFAULT_MAX_DURATION_PER_TRIGGER = f"{LIVE.duration_ms}ms"
"""How long a round reads a Kafka partition at most outside backlog: a record read at once is
processed at once, and a round over a short backlog still takes a useful share of it."""


class DeliveryGuarantee(enum.Enum):
    """Flink's DeliveryGuarantee for sinks."""

    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


@dataclass(frozen=True)
class KafkaSource:
    """Kafka topics, read with confluent-kafka inside Spark tasks. Values decode with
    ``value_format`` (JSON objects by default; Avro, raw bytes or strings: formats.py), a whole
    fetch at a time; a value that does not decode is skipped and logged with its
    topic[partition]@offset. Partitions are assigned by the agent; offsets live in checkpoints, never in
    consumer-group commits. ``bounded``: read each partition up to the end offset it has when the
    job starts, then end the job (final checkpoint, then FINISHED).

    A round (Spark's trigger) reads each partition up to the end it had when the round was
    planned, as Spark's ``MicroBatchExecution`` plans a batch's end offsets before it runs: a
    record arriving meanwhile waits for the next round, which starts as soon as this one is
    read. Three bounds make a round shorter still, whichever comes first:
    ``max_records_per_partition``, ``max_offsets_per_trigger`` (Spark's option: records over all
    partitions, shared by each partition's backlog) and ``max_duration_per_trigger`` (how long a
    round may read; Flink's sources emit records as they arrive, and this keeps a round's records
    that close to arriving). Left unset, the per-partition bounds are 50,000 records and 200 ms,
    growing round by round to 250,000 and 1 s while the source processes backlog (the records
    it held at the start, or a bounded source's input: `sources.backlog`); set, they hold in
    every phase."""

    topics: list[str]
    bounded: bool = False
    max_records_per_partition: int | None = None
    """At most this many records per partition and round (None: 50,000, or up to 250,000 while
    processing backlog)."""
    value_format: ValueFormat = field(default_factory=JsonValues)
    max_offsets_per_trigger: int | None = None
    """At most this many records per round over every partition (None: no such bound)."""
    max_duration_per_trigger: str | int | None = None
    """How long a round may read one partition, from its first fetch (a duration: ``200ms``,
    ``1s``; a bare number is milliseconds. None: 200 ms, or up to 1 s while processing
    backlog)."""
    properties: Mapping[str, str | int] = field(default_factory=dict)
    """librdkafka consumer settings over the agent's Kafka client configuration (as Flink's
    KafkaSource takes consumer properties): another cluster's credentials, fetch sizes. The
    settings sparkpoint's reads rest on are its own (``group.id``, ``enable.auto.commit``,
    ``isolation.level``, ``auto.offset.reset``, ``enable.partition.eof``)."""
    watermark_strategy: WatermarkStrategy | None = None
    """Event time and watermarks (None: the job has no event time). Without a timestamp
    column, each record's Kafka timestamp is its event time, added as column ``timestamp``."""

    def __post_init__(self) -> None:
        _check_records(self.max_records_per_partition)
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError(
                f"max_offsets_per_trigger must be at least 1, got {self.max_offsets_per_trigger}"
            )
        if self.duration_bound_ms is not None and self.duration_bound_ms < 1:
            raise ValueError(
                f"max_duration_per_trigger must be positive, got {self.max_duration_per_trigger!r}"
            )

    @property
    def max_duration_ms(self) -> int:
        """How long a round reads a partition outside backlog."""
        bound = self.duration_bound_ms
        return LIVE.duration_ms if bound is None else bound

    @property
    def duration_bound_ms(self) -> int | None:
        """The job's own bound on a round's reading time (None: left to the phase)."""
        if self.max_duration_per_trigger is None:
            return None
        return parse_duration(self.max_duration_per_trigger)

    @property
    def format(self) -> str:
        return "kafka"


@dataclass(frozen=True)
class FileSource:
    """Parquet or JSON-lines files (an fsspec URL; glob patterns allowed), read once: a bounded
    source, the job finishes after its final checkpoint. Each file is a split; its position (the
    rows read) is carried in checkpoints."""

    path: str
    format: str = "parquet"
    max_records_per_partition: int | None = None
    """At most this many rows per file and round (None: 50,000, growing round by round to
    250,000: a file is backlog)."""
    watermark_strategy: WatermarkStrategy | None = None
    """Event time and watermarks from a column of the files (they have no record timestamps:
    the strategy names its column)."""

    def __post_init__(self) -> None:
        _check_records(self.max_records_per_partition)
        if self.format not in ("parquet", "json"):
            raise ValueError(f"file source format must be parquet or json, got {self.format!r}")
        strategy = self.watermark_strategy
        if strategy is not None and strategy.timestamp_column is None:
            raise ValueError(
                "a file source's watermark strategy must name its timestamp column "
                "(WatermarkStrategy...with_timestamp_column(name)): files have no record timestamps"
            )

    @property
    def bounded(self) -> bool:
        return True


def _check_records(records: int | None) -> None:
    if records is not None and records < 1:
        raise ValueError(f"max_records_per_partition must be at least 1, got {records}")


@dataclass(frozen=True)
class KafkaSink:
    """Records as values in ``value_format`` (JSON objects by default) keyed by the key column. EXACTLY_ONCE: each epoch's output is
    published in one transaction with an "epoch published" marker once its checkpoint completes."""

    topic: str
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    key_column: str | None = None
    value_format: ValueFormat = field(default_factory=JsonValues)
    properties: Mapping[str, str | int] = field(default_factory=dict)
    """librdkafka producer settings over the agent's Kafka client configuration and over
    sparkpoint's (as Flink's KafkaSink takes producer properties); ``transactional.id`` is the
    sink's own and cannot be set."""
    side_outputs: Mapping[str, str] = field(default_factory=dict)
    """Side output name -> topic (Flink's ``OutputTag`` and ``getSideOutput``): an output row
    whose `SIDE_OUTPUT` column names one goes to its topic, in the same transaction as the
    rest of its epoch, so exactly once too; e.g. ``{"late": "payments-late"}`` for a window's
    late records (``WindowAggregate(late_output="late")``)."""


SIDE_OUTPUT = "side_output"
"""The column of a function's output that sends a row to a side output of the Kafka sink
(`KafkaSink.side_outputs`) by name; empty or absent: the main output."""


@dataclass(frozen=True)
class FileSink:
    """Parquet part files under ``directory`` (any fsspec URL). EXACTLY_ONCE: part files are
    written hidden (``.part-...inprogress``) and renamed into place when their checkpoint
    completes, as Flink's FileSink commits."""

    directory: str
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE


Source = KafkaSource | FileSource
Sink = KafkaSink | FileSink
