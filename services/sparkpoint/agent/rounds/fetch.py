"""Stage 1, inside Spark tasks: read a Kafka offset range (or rows of a file), map and filter,
assign key groups, partition by target subtask into segment files. Takes and returns plain
picklable values; the driver plans and keeps the books (rounds.py)."""

from __future__ import annotations

import io
import time
import zlib
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import pairwise
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson
from confluent_kafka import KafkaError, Message

from sparkpoint.agent.formats import JsonValues, ValueFormat
from sparkpoint.agent.job import MapFunction
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, to_ipc
from sparkpoint.agent.rounds.user_code import user_code
from sparkpoint.agent.sources.consumers import CONSUMERS
from sparkpoint.agent.state.backend import read_file, write_files
from sparkpoint.agent.time.strategy import KAFKA_TIMESTAMP_COLUMN, event_times
from sparkpoint.common.kafka import fetched
from sparkpoint.common.kafka_config import Frozen
from sparkpoint.common.keygroups import key_groups, operator_indexes

IDLE_POLLS = 3
"""Empty polls in a row after which a read with no planned end ahead stops (3 x
`POLL_WAIT_S`): nothing more is arriving."""

POLL_BATCH = 10_000

POLL_WAIT_S = 0.05
"""How long a stage-1 read waits for the next record before counting an idle poll."""


@dataclass(frozen=True)
class FetchTask:
    bootstrap: str
    topic: str
    partition: int
    start: int
    end: int | None
    """Stop before this offset (bounded sources); None: read what is there."""
    max_records: int
    key: str
    max_parallelism: int
    parallelism: int
    format: str = "kafka"
    """kafka (``topic`` and ``partition``), or parquet / json (``topic`` is a file URL)."""
    channel_dir: str = ""
    """Where the task writes its segments: ``<channel_dir>/s<subtask>/...``."""
    fetch_id: int = 0
    value_format: ValueFormat = field(default_factory=JsonValues)
    """How Kafka values decode into columns."""
    until: int | None = None
    """The partition's end when the round was planned: the read stops there (Kafka)."""
    max_duration_s: float = 0.2
    """How long the read may take, from its first fetch (Kafka)."""
    properties: Frozen = ()
    """The consumer's client properties (the agent's configuration and the source's): a task
    runs where the agent's configuration file may not be (Kafka)."""
    event_time_column: str | None = None
    """The column holding event time, when the source declares a watermark strategy: the
    result reports its highest value."""
    kafka_timestamps: bool = False
    """Add each Kafka record's timestamp as column `KAFKA_TIMESTAMP_COLUMN` (ms)."""


@dataclass(frozen=True)
class FetchResult:
    topic: str
    partition: int
    next_offset: int
    records: int
    segments: list[tuple[int, str, int, int]]
    """(subtask, segment file relative to the channel directory, rows, bytes) for every subtask
    that got records: the records themselves stay on storage, the driver gets this."""
    malformed: list[tuple[int, str]]
    """(offset, reason) of records that were skipped, the first few."""
    bytes_read: int = 0
    """Bytes of the records read (values), for the driver's bytes-per-input-byte figure."""
    capped: bool = False
    """The read stopped at ``max_records`` or at its time bound: more may follow at once,
    whatever the broker's high watermark says (the embedded broker's can stop at the last
    batch's base offset)."""
    highest_event_time: int | None = None
    """The highest event time among the records read (before the job's map), when the source
    declares event time and the read took records."""
    bounded: bool = False
    """The read stopped at one of its bounds (records or time), not at what had arrived: a
    backlog is there (`Rounds.pause_left` does not pace the next round)."""


def segment_name(task: FetchTask, subtask: int) -> str:
    """A segment file's name under the channel directory: unique per fetch, partition and
    subtask, ordered by fetch."""
    source = zlib.crc32(task.topic.encode()) % 10**8
    return f"s{subtask:04d}/f{task.fetch_id:010d}-{source:08d}-p{task.partition:05d}.arrow"


@dataclass
class PartitionRead:
    """What a stage-1 read took of one partition so far."""

    task: FetchTask
    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    """The records' Kafka timestamps (ms), when the task asks for them."""
    next_offset: int = 0
    closed: bool = False
    """Nothing more is taken from it in this read."""
    early: bool = False
    """It stopped before its end was known to be reached: more may be read at once."""

    def __post_init__(self) -> None:
        self.next_offset = self.task.start
        self._check()

    @property
    def short(self) -> bool:
        """Short of the end the driver planned: records are known to be there."""
        until = self.task.until
        return not self.closed and until is not None and self.next_offset < until

    @property
    def unplanned(self) -> bool:
        """Open with no planned end: it reads what is there."""
        return not self.closed and self.task.until is None

    @property
    def more_may_follow(self) -> bool:
        """Whether the partition may hold more records now, whatever the broker's high watermark
        says: the read stopped early, or it took records past its planned end or without one
        (a high watermark behind them is stale: the embedded broker's counts only the last
        batch's base offset). The driver reads it again until a read finds nothing."""
        if self.early:
            return True
        until = self.task.until
        return self.next_offset > until if until is not None else bool(self.offsets)

    def take(self, offset: int, value: bytes | None, key: bytes | None, timestamp: int = 0) -> None:
        end = self.task.end
        if self.closed or offset < self.next_offset or (end is not None and offset >= end):
            return
        self.values.append(value or b"")
        self.keys.append(key)
        self.offsets.append(offset)
        if self.task.kafka_timestamps:
            self.timestamps.append(timestamp)
        self.next_offset = offset + 1
        self._check()

    def take_run(self, messages: list[Message], offsets: list[int]) -> None:
        """Takes a run of this partition's records (no errors among them) with their offsets,
        as `take` would one at a time, a list operation per field instead of calls per record.
        Offsets out of order (never from one fetch) go through `take`."""
        if self.closed:
            return
        if any(b <= a for a, b in pairwise(offsets)):
            for message, offset in zip(messages, offsets, strict=True):
                self.take(offset, message.value(), message.key(), message.timestamp()[1])
            return
        end = self.task.end
        first = bisect_left(offsets, self.next_offset)
        stop = len(offsets) if end is None else bisect_left(offsets, end, first)
        stop = min(stop, first + self.task.max_records - len(self.values))
        if stop <= first:
            return
        run = messages[first:stop]
        self.values.extend([message.value() or b"" for message in run])
        self.keys.extend([message.key() for message in run])
        self.offsets.extend(offsets[first:stop])
        if self.task.kafka_timestamps:
            self.timestamps.extend([message.timestamp()[1] for message in run])
        self.next_offset = offsets[stop - 1] + 1
        self._check()

    def at_partition_end(self, offset: int) -> None:
        """The broker reported the end of the partition at ``offset``: offsets below it without
        a record (transaction markers) are passed, and an unbounded read closes (a bounded one
        goes on to its own end, records may still be arriving)."""
        if self.closed:
            return
        end = self.task.end
        self.next_offset = max(self.next_offset, min(offset, end) if end is not None else offset)
        self._check()
        if end is None:
            self.closed = True

    def _check(self) -> None:
        end = self.task.end
        if end is not None and self.next_offset >= end:
            self.closed = True
        elif len(self.values) >= self.task.max_records:
            self.closed = self.early = True


def read_ranges(tasks: list[FetchTask]) -> list[PartitionRead]:
    """Reads every task's partition at once, with one consumer (one fetch serves them all),
    each from its ``start`` and for at most ``max_records`` records.

    A partition's read ends at the first of: ``end`` (bounded sources), ``max_records``, the
    end of the partition, or ``until`` (the end the driver planned), after which records that
    already arrived are taken too, without waiting. The whole read ends once no partition is
    short of its planned end and nothing more is already fetched, at the longest
    ``max_duration_s`` of the tasks (the partitions still open may read on at once), or after
    `IDLE_POLLS` empty polls when no planned end is ahead. The embedded broker's high watermark
    can stop at the last batch's base offset: the rest of that batch arrives with the record at
    ``until - 1`` and is taken with it, so a planned end reaches every record that had arrived.
    Offsets that hold no record (transaction markers) are passed when the end of the partition
    is reported."""
    reads = {(t.topic, t.partition): PartitionRead(t) for t in tasks}
    one_topic = tasks[0].topic if len({t.topic for t in tasks}) == 1 else None
    cluster = (tasks[0].bootstrap, tasks[0].properties)
    consumer = CONSUMERS.take(cluster, [(t.topic, t.partition, t.start) for t in tasks])
    try:
        deadline = time.monotonic() + max(t.max_duration_s for t in tasks)
        idle = 0
        while not all(r.closed for r in reads.values()):
            short = any(r.short for r in reads.values())
            waiting = short or any(r.unplanned for r in reads.values())
            left = deadline - time.monotonic()
            wait = max(0.0, min(POLL_WAIT_S, left)) if waiting else 0.0
            messages = fetched(consumer, wait, POLL_BATCH)
            if not messages:
                if not waiting:
                    break  # every planned end, and whatever arrived with them
                if time.monotonic() >= deadline:
                    for read in reads.values():
                        read.early |= not read.closed
                    break
                idle = 0 if short else idle + 1
                if idle >= IDLE_POLLS:
                    break  # no planned end ahead, and nothing arrives
                continue
            idle = 0
            take(reads, messages, one_topic)
            if time.monotonic() >= deadline:
                for read in reads.values():
                    read.early |= not read.closed
                break  # out of time (what the last poll brought is taken)
    except BaseException:
        CONSUMERS.discard(consumer)
        raise
    CONSUMERS.give_back(cluster, consumer)
    return [reads[(t.topic, t.partition)] for t in tasks]


def take(
    reads: dict[tuple[str, int], PartitionRead], messages: list[Message], topic: str | None
) -> None:
    """Hands a fetch's messages to their partitions' reads, in order. A fetch without errors
    goes by runs of one partition (`PartitionRead.take_run`): per record, the stage-1 loop of
    calls and appends was a sixth of the workers' CPU (py-spy, bench/peers.py); with errors
    (the end of a partition, mostly) one message at a time. ``topic``: the only topic read
    (its messages need no ``topic()`` call)."""
    if any([message.error() for message in messages]):
        for message in messages:
            one(reads, message)
        return
    # a record's partition and offset are never None (only an error's may be)
    offsets = cast(list[int], [message.offset() for message in messages])
    if topic is not None:  # runs told apart by partition alone: no tuple per record
        runs: list[object] = [message.partition() for message in messages]
    else:
        runs = [(str(message.topic()), message.partition()) for message in messages]
    cuts = [i for i in range(1, len(runs)) if runs[i] != runs[i - 1]]
    for start, stop in pairwise([0, *cuts, len(runs)]):
        name = cast(tuple[str, int], runs[start] if topic is None else (topic, runs[start]))
        reads[name].take_run(messages[start:stop], offsets[start:stop])


def one(reads: dict[tuple[str, int], PartitionRead], message: Message) -> None:
    read = reads[(str(message.topic()), int(message.partition() or 0))]
    error = message.error()
    if error is None:
        read.take(
            int(message.offset() or 0), message.value(), message.key(), message.timestamp()[1]
        )
    elif error.code() == KafkaError._PARTITION_EOF:
        read.at_partition_end(int(message.offset() or 0))
    else:
        raise RuntimeError(f"{read.task.topic}[{read.task.partition}]: {error.str()}")


def read_file_rows(task: FetchTask) -> tuple[pd.DataFrame, int]:
    """Rows ``start`` to ``start + max_records`` (at most ``end``) of a Parquet or JSON-lines file."""
    import pyarrow.parquet as pq

    data = read_file(task.topic)
    if task.format == "parquet":
        table = pq.read_table(pa.BufferReader(data))
    else:
        table = pajson.read_json(io.BytesIO(data))
    stop = min(task.end if task.end is not None else table.num_rows, task.start + task.max_records)
    return table.slice(task.start, max(0, stop - task.start)).to_pandas(), max(task.start, stop)


def fetch_and_partition(tasks: list[FetchTask], map_function: MapFunction) -> list[FetchResult]:
    """A stage-1 task: the partitions of one source subtask (Kafka: read together), each mapped,
    keyed and written as segments per target subtask."""
    if tasks[0].format == "kafka":
        return [partition(read.task, read, map_function) for read in read_ranges(tasks)]
    return [partition(task, None, map_function) for task in tasks]


def partition(
    task: FetchTask, read: PartitionRead | None, map_function: MapFunction
) -> FetchResult:
    """One partition's records (``read``, or rows of a file) mapped, keyed by key group and
    written as one segment per target subtask."""
    malformed: list[tuple[int, str]] = []
    if read is not None:
        bytes_read = sum(len(v) for v in read.values)
        frame, malformed = task.value_format.decode(read.values, read.keys, read.offsets)
        records, next_offset, early = len(read.values), read.next_offset, read.more_may_follow
        bounded = read.early
        if task.kafka_timestamps and len(frame):
            frame[KAFKA_TIMESTAMP_COLUMN] = kept_timestamps(read, malformed)
    else:
        frame, next_offset = read_file_rows(task)
        records = len(frame)
        early = bounded = records >= task.max_records
        bytes_read = int(frame.memory_usage(deep=True).sum()) if records else 0
    segments: list[tuple[int, str, int, int]] = []
    highest = highest_event_time(frame, task.event_time_column)
    if len(frame):
        frame = user_code(map_function, frame)
    if len(frame):
        written: dict[str, bytes] = {}
        for subtask, part in by_subtask(frame, task.key, task.max_parallelism, task.parallelism):
            data = to_ipc(part)
            name = segment_name(task, subtask)
            written[f"{task.channel_dir}/{name}"] = data
            segments.append((subtask, name, len(part), len(data)))
        # written whole (renamed into place on local disk): a checkpoint may hard-link them
        write_files(written)
    return FetchResult(
        task.topic,
        task.partition,
        next_offset,
        records,
        segments,
        malformed[:10],
        bytes_read,
        capped=early,
        highest_event_time=highest,
        bounded=bounded,
    )


def by_subtask(
    frame: pd.DataFrame, key: str, max_parallelism: int, parallelism: int
) -> list[tuple[int, pd.DataFrame]]:
    """Mapped records keyed: each row's key group in `KEY_GROUP_COLUMN`, split by the subtask
    that owns it (in subtask order, each part in the records' order)."""
    if key not in frame.columns:
        raise KeyError(
            f"key column {key!r} is not in the records after map (columns: {list(frame.columns)})"
        )
    if not len(frame):
        return []
    groups = key_groups(frame[key].to_numpy(), max_parallelism)
    subtasks = operator_indexes(max_parallelism, parallelism, groups)
    frame = frame.assign(**{KEY_GROUP_COLUMN: groups})
    # a stable sort and its boundaries, not ``groupby(array)``: pandas first looks the array up
    # as a column label and formats it into the KeyError it catches (2% of the workers' CPU)
    order = np.argsort(subtasks, kind="stable")
    ordered = subtasks[order]
    bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(order)]
    return [
        (int(ordered[start]), frame.take(order[start:end]).reset_index(drop=True))
        for start, end in pairwise(bounds)
    ]


def kept_timestamps(read: PartitionRead, malformed: list[tuple[int, str]]) -> list[int]:
    """The Kafka timestamps of the records that decoded (the malformed ones are skipped)."""
    if not malformed:
        return read.timestamps
    skipped = {offset for offset, _ in malformed}
    return [t for o, t in zip(read.offsets, read.timestamps, strict=True) if o not in skipped]


def highest_event_time(frame: pd.DataFrame, column: str | None) -> int | None:
    """The highest event time of a fetch's records, as the source read them (Flink assigns
    timestamps at the source, before any operator)."""
    if column is None or not len(frame):
        return None
    if column not in frame.columns:
        raise KeyError(
            f"event time column {column!r} is not in the records read (columns: "
            f"{list(frame.columns)}); name it with WatermarkStrategy.with_timestamp_column"
        )
    return int(event_times(frame[column]).max())
