"""What runs inside Spark tasks: stage 1 (read a Kafka offset range, map/filter, key groups,
partition by subtask) and stage 2 (one subtask's keyed function over its key groups, new state
versions, staged output). Both take and return plain picklable values; the driver plans and
keeps the books (runtime.py).
"""

from __future__ import annotations

import io
import logging
import time
import traceback
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.json as pajson
from confluent_kafka import KafkaError

from sparkpoint.agent.formats import JsonValues, ValueFormat
from sparkpoint.agent.job import (
    KeyedFunction,
    KeyedState,
    MapFunction,
    StateDescriptor,
    empty_series,
)
from sparkpoint.agent.sources.consumers import CONSUMERS
from sparkpoint.agent.state.backend import (
    decode_state,
    encode_state,
    read_file,
    read_files,
    working_path,
    write_files,
)
from sparkpoint.common.kafka import fetched
from sparkpoint.common.kafka_config import Frozen
from sparkpoint.common.keygroups import key_groups, operator_indexes

log = logging.getLogger(__name__)

KEY_GROUP_COLUMN = "_key_group"

IDLE_POLLS = 3
"""Empty polls in a row after which a read with no planned end ahead stops (3 x
`POLL_WAIT_S`): nothing more is arriving."""

POLL_BATCH = 10_000

POLL_WAIT_S = 0.05
"""How long a stage-1 read waits for the next record before counting an idle poll."""


# --- the job's own code ------------------------------------------------------------------------


@dataclass(frozen=True)
class UserCodeFailure:
    """What a task returns when the job's own function (map, keyed function) raised. It is
    returned, not raised: an exception out of a task ends PySpark's Python worker, and the
    restarted job's first rounds would pay for new workers (imports, cold state caches). A
    failure of sparkpoint's own work (reading Kafka, writing files) is raised, so that Spark
    retries the task where the cluster allows it."""

    exception_name: str
    message: str
    stacktrace: str


class UserCodeRaised(Exception):
    def __init__(self, failure: UserCodeFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class UserFunctionError(RuntimeError):
    """Raised on the driver for a `UserCodeFailure`: carries the function's exception name and
    the stack trace from the task, which the job's exception history shows."""

    def __init__(self, failure: UserCodeFailure) -> None:
        super().__init__(f"{failure.exception_name}: {failure.message}")
        self.exception_name = failure.exception_name
        self.stacktrace = failure.stacktrace


T = TypeVar("T")


def user_code(call: Callable[..., T], *args: Any) -> T:
    """Calls the job's function, turning what it raises into `UserCodeRaised`."""
    try:
        return call(*args)
    except Exception as exc:
        raise UserCodeRaised(
            UserCodeFailure(type(exc).__qualname__, str(exc), "".join(traceback.format_exc()))
        ) from exc


def guarded(run: Callable[..., T], *args: Any) -> T | UserCodeFailure:
    """Runs a task body; the job's function raising is its result (see `UserCodeFailure`)."""
    try:
        return run(*args)
    except UserCodeRaised as raised:
        return raised.failure


def unless_user_failed(results: list[T | UserCodeFailure]) -> list[T]:
    """The tasks' results; `UserFunctionError` if the job's function raised in one."""
    done: list[T] = []
    for result in results:
        if isinstance(result, UserCodeFailure):
            raise UserFunctionError(result)
        done.append(result)
    return done


# --- stage 1 ------------------------------------------------------------------------------------


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

    def take(self, offset: int, value: bytes | None, key: bytes | None) -> None:
        end = self.task.end
        if self.closed or offset < self.next_offset or (end is not None and offset >= end):
            return
        self.values.append(value or b"")
        self.keys.append(key)
        self.offsets.append(offset)
        self.next_offset = offset + 1
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
            for message in messages:
                read = reads[(str(message.topic()), int(message.partition() or 0))]
                error = message.error()
                if error is None:
                    read.take(int(message.offset() or 0), message.value(), message.key())
                elif error.code() == KafkaError._PARTITION_EOF:
                    read.at_partition_end(int(message.offset() or 0))
                else:
                    raise RuntimeError(f"{read.task.topic}[{read.task.partition}]: {error.str()}")
            if time.monotonic() >= deadline:
                for read in reads.values():
                    read.early |= not read.closed
                break  # out of time (what the last poll brought is taken)
    except BaseException:
        CONSUMERS.discard(consumer)
        raise
    CONSUMERS.give_back(cluster, consumer)
    return [reads[(t.topic, t.partition)] for t in tasks]


def to_ipc(frame: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(payload: bytes | str) -> pd.DataFrame:
    data = read_file(payload) if isinstance(payload, str) else payload
    return ipc.open_stream(pa.BufferReader(data)).read_all().to_pandas()


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
        records, next_offset, early = len(read.values), read.next_offset, read.early
    else:
        frame, next_offset = read_file_rows(task)
        records = len(frame)
        early = records >= task.max_records
        bytes_read = int(frame.memory_usage(deep=True).sum()) if records else 0
    segments: list[tuple[int, str, int, int]] = []
    if len(frame):
        frame = user_code(map_function, frame)
    if len(frame):
        if task.key not in frame.columns:
            raise KeyError(
                f"key column {task.key!r} is not in the records after map (columns: {list(frame.columns)})"
            )
        groups = key_groups(frame[task.key].to_numpy(), task.max_parallelism)
        subtasks = operator_indexes(task.max_parallelism, task.parallelism, groups)
        frame = frame.assign(**{KEY_GROUP_COLUMN: groups})
        written: dict[str, bytes] = {}
        for subtask, part in frame.groupby(subtasks, sort=True):
            data = to_ipc(part.reset_index(drop=True))
            name = segment_name(task, int(subtask))
            written[f"{task.channel_dir}/{name}"] = data
            segments.append((int(subtask), name, len(part), len(data)))
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
    )


# --- stage 2 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessTask:
    """Only metadata travels to a stage-2 task: segment names, state versions, directories."""

    subtask: int
    channel_dir: str
    segments: list[str]
    """The subtask's segment files (relative to ``channel_dir``), in order."""
    versions: dict[int, int | str]
    """Every key group of this subtask that has state: its working version (a round number:
    the file is `working_path`), or the path of a restored file."""
    state_dir: str
    version: int
    output_path: str
    end_of_input: bool = False
    segment_key_groups: list[tuple[int, int] | None] | None = None
    """Per segment, the key groups whose rows it holds for this subtask (None: all its rows).
    Restored channel state was written for the old parallelism's subtasks: a file may also
    hold rows of key groups another subtask owns now, which this one drops."""
    key: str = ""
    """The records' key column."""
    emit: Callable[[pd.DataFrame], int] | None = None
    """At-least-once sinks: makes the round's output visible from the task at once (the
    sink's `direct`); None: the output is staged at ``output_path``."""

    def state_file(self, group: int) -> str | None:
        found = self.versions.get(group)
        if found is None or isinstance(found, str):
            return found
        return working_path(self.state_dir, group, found)


@dataclass(frozen=True)
class ProcessResult:
    subtask: int
    new_versions: dict[int, int]
    """Key group -> size of its new state file (at `working_path` for the task's version), for
    every key group whose state changed."""
    output_path: str | None
    """The round's staged output, when it emitted any."""
    output_rows: int = 0
    """Records the round emitted (staged or, at-least-once, made visible)."""


_CACHE: OrderedDict[str, dict[str, pd.Series]] = OrderedDict()
"""Decoded state files by path, per Python worker (Spark reuses workers): files never change,
so a path is a safe key."""
CACHE_ENTRIES = 512


WRITE_BATCH_BYTES = 64 << 20
"""Stage 2 writes a round's files in batches of about this many bytes (`write_files`: on an
object store a batch's PUTs are in flight together)."""


def load_states(
    paths: Mapping[int, str], declared: Mapping[str, StateDescriptor]
) -> dict[int, dict[str, pd.Series]]:
    """Key group -> its state file's series, from the worker's cache when it has them (shared,
    never to be changed in place: `merged_state` concatenates them into new series); the files
    it lacks are read together (`read_files`)."""
    loaded: dict[int, dict[str, pd.Series]] = {}
    missing: dict[str, int] = {}
    for group, path in paths.items():
        frames = _CACHE.get(path)
        if frames is None:
            missing[path] = group
        else:
            _CACHE.move_to_end(path)
            loaded[group] = frames
    for path, data in read_files(missing).items():
        loaded[missing[path]] = frames = decode_state(data, declared)
        remember(path, frames)
    return {group: loaded[group] for group in paths}


def remember(path: str, frames: dict[str, pd.Series]) -> None:
    _CACHE[path] = frames
    while len(_CACHE) > CACHE_ENTRIES:
        _CACHE.popitem(last=False)


def keep_key_groups(frame: pd.DataFrame, groups: tuple[int, int] | None) -> pd.DataFrame:
    if groups is None or not len(frame):
        return frame
    return frame[frame[KEY_GROUP_COLUMN].between(*groups)]


def merged_state(
    loaded: Mapping[int, Mapping[str, pd.Series]], declared: Mapping[str, StateDescriptor]
) -> dict[str, pd.Series]:
    """The state of several key groups as one series per declared state (new series: the
    cached ones stay as they were)."""
    merged: dict[str, pd.Series] = {}
    for name, descriptor in declared.items():
        parts = [frames[name] for frames in loaded.values() if name in frames]
        merged[name] = (pd.concat(parts) if parts else empty_series(descriptor)).astype(
            descriptor.dtype
        )
    return merged


def key_owners(
    loaded: Mapping[int, Mapping[str, pd.Series]], keys: np.ndarray, groups: pd.Series
) -> pd.Series:
    """Key -> key group for every key the call was given: the keys of the loaded state files
    and of the round's records."""
    owners = [
        pd.Series(group, index=series.index.get_level_values(0).unique())
        for group, frames in loaded.items()
        for series in frames.values()
        if len(series)
    ]
    owners.append(pd.Series(groups.to_numpy(), index=keys))
    found = pd.concat(owners)
    return found[~found.index.duplicated()]


def split_state(name: str, series: pd.Series, owners: pd.Series) -> dict[int, pd.Series]:
    """One merged state series, back into its key groups' series."""
    if not len(series):
        return {}
    keys = series.index.get_level_values(0)
    groups = owners.reindex(keys)
    if groups.isna().any():
        stranger = keys[groups.isna().to_numpy()][0]
        raise UserCodeRaised(
            UserCodeFailure(
                "KeyError",
                f"state {name!r} was set for key {stranger!r}, which is not among the keys the "
                "keyed function was given (a keyed function changes the state of its records' "
                "keys only)",
                "",
            )
        )
    return {int(g): part for g, part in series.groupby(groups.to_numpy(), sort=False)}


def process_subtask(task: ProcessTask, function: KeyedFunction) -> ProcessResult:
    """One call of the keyed function for the subtask's round: every record the round brought
    (in segment order, so each key's in source order) with the merged state of the key groups
    they belong to; at the end of a bounded input, `on_end_of_input` once with the state of
    every key group the subtask has (when it has any). The state is then split back per key
    group, and each key group the call had gets a new state version (DESIGN.md section 4:
    state stays per key group, a Python call per round, not per key group or record)."""
    declared = function.state
    ranges = task.segment_key_groups or [None] * len(task.segments)
    paths = [f"{task.channel_dir}/{name}" for name in task.segments]
    segment_bytes = read_files(paths)  # on an object store, fetched together
    frames = [
        keep_key_groups(from_ipc(segment_bytes[path]), groups)
        for path, groups in zip(paths, ranges, strict=True)
    ]
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    groups = records.pop(KEY_GROUP_COLUMN) if len(records) else pd.Series([], dtype="int32")
    had = {int(g) for g in groups.unique()}
    if task.end_of_input:
        had |= set(task.versions)
    loaded = load_states({g: path for g in sorted(had) if (path := task.state_file(g))}, declared)
    # the records' keys, taken before the function runs (it may change the frame)
    keys = records[task.key].to_numpy(copy=True) if len(records) else np.array([], dtype=object)
    state = KeyedState(declared, merged_state(loaded, declared))
    outputs: list[pd.DataFrame] = []
    if len(records):
        outputs.append(user_code(function.process, records, state))
    if task.end_of_input and any(len(series) for series in state.frames().values()):
        outputs.append(user_code(function.on_end_of_input, state))
    batch = WriteBatch()
    new_versions = (
        write_states(task, batch, state, loaded, key_owners(loaded, keys, groups), had)
        if state.changed
        else {}
    )
    emitted = [out for out in outputs if out is not None and len(out)]
    rows = sum(len(out) for out in emitted)
    output_path = None
    if emitted and task.emit is None:
        output_path = task.output_path
        batch.add(output_path, to_ipc(pd.concat(emitted, ignore_index=True)))
    batch.flush()
    if emitted and task.emit is not None:
        # at-least-once: visible before the round's result reaches the driver, so before any
        # checkpoint that counts the round's input as processed
        task.emit(pd.concat(emitted, ignore_index=True))
    return ProcessResult(task.subtask, new_versions, output_path, rows)


def write_states(
    task: ProcessTask,
    batch: WriteBatch,
    state: KeyedState,
    loaded: dict[int, dict[str, pd.Series]],
    owners: pd.Series,
    had: set[int],
) -> dict[int, int]:
    """The state the function changed, split back per key group (``owners``: each key's key
    group) and written as each key group's new version; returns the key groups written and the
    size of each new file."""
    declared = state.declared
    split = {
        name: split_state(name, series, owners)
        for name, series in state.frames().items()
        if name in state.changed
    }
    new_versions: dict[int, int] = {}
    for group in sorted(had.union(*split.values())):
        before = loaded.get(group)
        frames_of_group = {
            name: split[name].get(group, empty_series(descriptor))
            if name in split
            else (before or {}).get(name, empty_series(descriptor))
            for name, descriptor in declared.items()
        }
        if before is None and not any(len(f) for f in frames_of_group.values()):
            continue  # no state before, none now: nothing to keep
        data = encode_state(frames_of_group)
        batch.add(working_path(task.state_dir, group, task.version), data, frames_of_group)
        new_versions[group] = len(data)
    return new_versions


@dataclass
class WriteBatch:
    """A stage-2 task's new files, written together (`write_files`) once they hold
    `WRITE_BATCH_BYTES`, and at the end; a state file's series enter the worker's cache once
    the file is written."""

    files: dict[str, bytes] = field(default_factory=dict)
    frames: dict[str, dict[str, pd.Series]] = field(default_factory=dict)
    size: int = 0

    def add(self, path: str, data: bytes, frames: dict[str, pd.Series] | None = None) -> None:
        self.files[path] = data
        if frames is not None:
            self.frames[path] = frames
        self.size += len(data)
        if self.size >= WRITE_BATCH_BYTES:  # bounds the memory a round holds
            self.flush()

    def flush(self) -> None:
        write_files(self.files)
        for path, frames in self.frames.items():
            remember(path, frames)
        self.files, self.frames, self.size = {}, {}, 0


def output_file(sink_dir: str, round_id: int, subtask: int) -> str:
    return f"{sink_dir}/out-r{round_id:08d}-s{subtask:04d}-{uuid.uuid4().hex[:8]}.arrow"
