"""Restored channel state on its way into the channels, and whether the job may checkpoint
meanwhile (FLIP-547, checkpointing during recovery).

An unaligned checkpoint's channel state is a run of segment files per old subtask, each tagged
with the key groups whose rows in it were that subtask's. After a rescale a file overlaps
several new subtasks, and each keeps only its own rows.

- **Without** ``execution.checkpointing.unaligned.during-recovery.enabled`` (Flink's behaviour
  before FLIP-547): every restored file is queued at once, ahead of any new input, and stage 2
  keeps the subtask's rows of each while processing it. Every trigger is declined
  ``TASK_NOT_READY`` (not a failure) until the restored segments are processed: a checkpoint
  never persists a restored record, and progress made during recovery is not recorded.
- **With** it: a file whose rows all belong to the subtask (no rescale) is queued as it is.
  Files of another parallelism are *filtered* by executor tasks, a Spark job in a pool of its
  own that shares the cores with stage 2 (processing goes on beside it): each task reads a run
  of restored files once and splits its rows by owner, one new segment file per new subtask
  (as Flink's filtering, which every new subtask does on its own copy, but reading each file
  once: a rescale to 10 does not read the channel state 10 times). A
  segment enters its channel while the channel has room (the seed's P1, buffer available), waits
  on the channel storage otherwise ("spilled", P2) and enters as the channel drains (P3, replay),
  always in the restored order and ahead of new input: stage 1 is held back until every restored
  segment is queued (the seed's 4.6). A trigger is declined ``TASK_NOT_READY`` while any file is
  still unfiltered; from then on checkpoints are taken, and their channel state is the filtered
  segments still queued or spilled. A restored record another subtask owns is never persisted
  again, so channel state does not grow across rescales (1 -> 10 -> 1 -> 10 persists the bytes
  of the original in-flight records once, where Flink before the FLIP persisted them 10x, then
  100x).

Channel buffers here are files already (the channel capacity, ``--channel-capacity``, is the
budget of buffered bytes that backpressure and admission count), so a spilled segment is a
filtered file not yet counted in its channel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.recovery.channel_state import ChannelStateFile
from sparkpoint.agent.rounds.channels import Channel, Segment
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN
from sparkpoint.agent.state.backend import (
    into_place,
    link_or_copy,
    local_path,
    read_file,
    read_table,
    write_file,
)
from sparkpoint.common.keygroups import KeyGroupRange, operator_indexes

log = logging.getLogger(__name__)

FILTER_BATCH_BYTES = 256 * 1024 * 1024
"""Restored bytes one filter task reads at most on local channel storage: its output is one
segment file per new subtask, and it holds one restored file at a time (`SplitOutputs`)."""

HELD_BATCH_BYTES = 64 * 1024 * 1024
"""The same where the channel storage is not local: a task holds its output until it puts it."""

READ_AHEAD_BYTES = 32 * 1024 * 1024
"""Restored bytes a filter task keeps requested ahead of the file it splits: from a local disk,
and from an object store where the files' sizes are known (held in memory there)."""

FETCHES_AHEAD = 8
"""Restored files a filter task keeps fetched, or being fetched, from an object store ahead of
the one it splits (held in memory until their turn)."""

FETCH_THREADS = 4
"""Fetches from an object store in flight at once per filter task."""

FIRST_BATCH_BYTES = 64 * 1024 * 1024
"""Restored bytes the first batch holds at most: its split is the first filter job, so the
subtasks get restored rows to process early."""


# --- executor side ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterTask:
    """A run of restored files to split among the new subtasks: only paths travel."""

    batch: int
    files: list[tuple[str, tuple[int, int]]]
    """(restored file, the key groups whose rows in it are to be kept), in the restored order."""
    max_parallelism: int
    parallelism: int
    channel_dir: str
    prefix: str
    """Output files are ``<channel_dir>/s<subtask>/<prefix>.arrow``."""
    sizes: tuple[int, ...] = ()
    """The restored files' bytes as the snapshot recorded them, when known: they bound what a
    task fetches ahead from an object store (`ReadAhead`)."""


@dataclass(frozen=True)
class FilterResult:
    batch: int
    outputs: dict[int, tuple[str, int, int]]
    """New subtask -> (segment file relative to the channel directory, rows, bytes), for every
    subtask that got rows."""
    read_bytes: int


def filter_restored(task: FilterTask) -> FilterResult:
    """Reads the task's restored files once, in order, keeps each file's rows of its key groups,
    and appends every new subtask's rows of it to that subtask's segment file: one output file
    per new subtask, its rows in their restored order. A file's rows are let go once split, so
    a task holds one restored file at a time, however many it reads (`SplitOutputs`), and on
    an object store the next few being fetched (`ReadAhead`, which has the next files on their
    way while a file is split). A file's owners are counted (``bincount``), and a file all of
    one subtask's is written whole, not filtered."""
    read = 0
    paths = [path for path, _ in task.files]
    with ReadAhead(paths, task.sizes) as ahead, SplitOutputs(task) as outputs:
        for k, (_, (first, last)) in enumerate(task.files):
            table, size = ahead.read(k)
            read += size
            if not table.num_rows:
                continue
            groups = table[KEY_GROUP_COLUMN]
            bounds = pc.min_max(groups)
            if not (first <= bounds["min"].as_py() and bounds["max"].as_py() <= last):
                # only files written before filtering existed hold rows outside their key groups
                table = table.filter(
                    pc.and_(pc.greater_equal(groups, first), pc.less_equal(groups, last))
                )
                groups = table[KEY_GROUP_COLUMN]
            owners = operator_indexes(task.max_parallelism, task.parallelism, groups.to_numpy())
            counts = np.bincount(owners, minlength=task.parallelism)  # a count, not a sort
            for subtask in np.flatnonzero(counts).tolist():
                whole = counts[subtask] == table.num_rows  # the file is all this subtask's
                outputs.append(subtask, table if whole else table.filter(owners == subtask))
    return FilterResult(task.batch, outputs.written, read)


class ReadAhead:
    """Reads a filter task's restored files in order, with the next ones already on their way
    while the task splits the one in hand. Restored channel state is read once, so without
    this every read waits with the core idle. The files after the one being read are asked
    for until at least `READ_AHEAD_BYTES` are (as far as their sizes are known):

    - **Local files:** the kernel is asked to read them (``posix_fadvise(WILLNEED)``: queued,
      nothing waits for it). One 256 MB task from a cold page cache: 0.73 -> 0.42 s on this
      machine.
    - **An object store:** they are fetched, `FETCH_THREADS` at a time, and held until their
      turn: at least the next file, at most `FETCHES_AHEAD`. Each GET waits for the store's
      latency; fetched one after another, 1-2 MB files do not fill a connection (moto on this
      machine: 150 MB/s one at a time, 200-250 MB/s four at a time; real S3's latency is
      higher).
    """

    def __init__(self, paths: list[str], sizes: Sequence[int] = ()) -> None:
        self.paths = paths
        local = [p for p in map(local_path, paths) if p is not None]
        self.local = local if len(local) == len(paths) else None
        self.sizes = list(sizes) if len(sizes) == len(paths) else [0] * len(paths)
        """Known or (locally) measured sizes of the files asked for; 0 where unknown."""
        self.requested = 0
        """Files asked for so far: every one before this index."""
        self.fetches: dict[int, Future[bytes]] = {}
        self.pool: ThreadPoolExecutor | None = None

    def read(self, k: int) -> tuple[pa.Table, int]:
        """File ``k`` as a table, and its bytes; files are read in order (``k`` 0, 1, ...)."""
        if self.local is None:
            last, at_least = min(k + 1 + FETCHES_AHEAD, len(self.paths)), k + 1
        else:
            last, at_least = len(self.paths), k
        ahead = sum(self.sizes[k + 1 : self.requested])
        while self.requested < last and (self.requested <= at_least or ahead < READ_AHEAD_BYTES):
            self._request(self.requested)
            if self.requested > k:
                ahead += self.sizes[self.requested]
            self.requested += 1
        if self.local is not None:
            return read_table(self.paths[k], memory_map=False)  # read once, cold: see read_table
        data = self.fetches.pop(k).result()
        return ipc.open_stream(pa.BufferReader(data)).read_all(), len(data)

    def close(self) -> None:
        """Lets go of fetches not needed any more (a failed task): those not started are
        dropped, those under way finish on their own."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.fetches.clear()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *failure: Any) -> None:
        self.close()

    def _request(self, j: int) -> None:
        if self.local is None:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="fetch-restored")
            self.fetches[j] = self.pool.submit(read_file, self.paths[j])
            return
        try:
            fd = os.open(self.local[j], os.O_RDONLY)
        except OSError:
            return  # reading it reports the failure
        try:
            with contextlib.suppress(OSError, AttributeError):  # advice only (none on macOS)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            self.sizes[j] = os.fstat(fd).st_size
        finally:
            os.close(fd)


class SplitOutputs:
    """The segment files one filter task writes, one per new subtask that gets rows, each an
    Arrow IPC stream opened at its first rows. On local disk rows go straight to a temporary
    file that `into_place` renames when the task ends (a failed task leaves none); elsewhere a
    stream is put whole at the end (an object store has no appends)."""

    def __init__(self, task: FilterTask) -> None:
        self.task = task
        self.local = local_path(task.channel_dir) is not None
        self.files = contextlib.ExitStack()
        self.streams: dict[int, tuple[ipc.RecordBatchStreamWriter, pa.BufferOutputStream | None]]
        self.streams = {}
        self.rows: dict[int, int] = {}
        self.written: dict[int, tuple[str, int, int]] = {}
        """New subtask -> (segment file relative to the channel directory, rows, bytes)."""

    def name(self, subtask: int) -> str:
        return f"s{subtask:04d}/{self.task.prefix}.arrow"

    def append(self, subtask: int, part: pa.Table) -> None:
        if subtask not in self.streams:
            target = f"{self.task.channel_dir}/{self.name(subtask)}"
            buffer = None
            if self.local:  # closed in reverse: the stream, the file, then renamed into place
                temporary = self.files.enter_context(into_place(target))
                sink: pa.NativeFile = self.files.enter_context(pa.OSFile(temporary, "wb"))
            else:
                sink = buffer = pa.BufferOutputStream()
            writer = self.files.enter_context(ipc.new_stream(sink, part.schema))
            self.streams[subtask], self.rows[subtask] = (writer, buffer), 0
        self.streams[subtask][0].write_table(part)
        self.rows[subtask] += part.num_rows

    def __enter__(self) -> SplitOutputs:
        self.files.__enter__()
        return self

    def __exit__(self, *failure: Any) -> None:
        self.files.__exit__(*failure)  # on a failure its temporaries are removed
        if failure[0] is not None:
            return  # the failure propagates; nothing is put
        for subtask, (_, buffer) in sorted(self.streams.items()):
            target = f"{self.task.channel_dir}/{self.name(subtask)}"
            if buffer is None:
                size = os.path.getsize(local_path(target) or target)
            else:
                data = buffer.getvalue()
                write_file(target, memoryview(data))
                size = int(data.size)
            self.written[subtask] = (self.name(subtask), self.rows[subtask], size)


# --- driver side ------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Restored files that span several new subtasks, split by one filter task."""

    number: int
    files: list[ChannelStateFile] = field(default_factory=list)
    in_flight: bool = False

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class Unfiltered:
    """A subtask's place in the restored order for its rows of a batch not split yet."""

    batch: Batch


@dataclass
class Ready:
    """A segment file under the channel directory, waiting for room in its channel."""

    path: str
    rows: int
    size: int
    key_groups: tuple[int, int] | None
    exact: bool = True


@dataclass
class ChannelRecovery:
    """The restored channel state of one attempt, per subtask in the restored order."""

    checkpoint_id: int = 0
    during_recovery: bool = False
    waiting: dict[int, deque[Unfiltered | Ready]] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)
    """Batches not split yet, in the restored order."""
    restored_through: dict[int, int] = field(default_factory=dict)
    """Per channel, the sequence of its last restored segment (the recovery without
    during-recovery ends once the channels have processed past it)."""
    futures: list[Future[list[FilterResult]]] = field(default_factory=list)
    """Filter jobs in flight."""
    spilled: int = 0
    """Filtered segments that could not enter their channel at once (P2)."""
    filtered_rows: int = 0
    read_bytes: int = 0
    filter_started: float | None = None
    filter_ended: float | None = None
    """Monotonic times of the first filter job's submission and of the last one's result (when
    it arrived, not when the loop applied it: the loop may still be registering)."""
    arrivals: dict[int, float] = field(default_factory=dict)
    """Filter job (by its future's id) -> when its result arrived."""

    @classmethod
    def adopt(
        cls, checkpoint_id: int, shares: dict[int, list[ChannelStateFile]],
        ranges: Sequence[KeyGroupRange], channels: list[Channel], channel_dir: str,
        during_recovery: bool, batch_bytes: int = FILTER_BATCH_BYTES,
    ) -> ChannelRecovery:  # fmt: skip
        """Queues (or, with during-recovery, lines up for splitting) each subtask's share. A file
        within one subtask's key groups is that subtask's as it is (no rescale, or an earlier
        rescale already split it); the others are split, ``batch_bytes`` of them per filter
        task at most (the first batch `FIRST_BATCH_BYTES` at most; at least one file; the agent
        passes its channel capacity when that is smaller, so a filtered segment fits a
        channel)."""
        recovery = cls(checkpoint_id, during_recovery)
        batch_of: dict[tuple[int, int], Batch] = {}
        restored = {(f.old_subtask, f.order): f for files in shares.values() for f in files}
        batch: Batch | None = None
        for key in sorted(restored):  # the restored order
            state_file = restored[key]
            first, last = state_file.key_groups
            within_one = any(r.start <= first and last <= r.end for r in ranges)
            if not during_recovery or (within_one and state_file.exact):
                batch = None  # queued as it is: a batch never spans it, so each subtask's share
                continue  # of a batch stays one run in its restored order
            limit = (
                batch_bytes if len(recovery.batches) > 1 else min(batch_bytes, FIRST_BATCH_BYTES)
            )
            if batch is None or batch.size + state_file.size > limit:
                batch = Batch(len(recovery.batches) + 1)
                recovery.batches.append(batch)
            batch.files.append(state_file)
            batch_of[key] = batch
        for subtask, files in shares.items():
            mine = ranges[subtask]
            queue: deque[Unfiltered | Ready] = deque()
            for state_file in files:
                batch = batch_of.get((state_file.old_subtask, state_file.order))
                if batch is not None:
                    if not (
                        queue and isinstance(queue[-1], Unfiltered) and queue[-1].batch is batch
                    ):
                        queue.append(Unfiltered(batch))
                    continue
                first, last = state_file.key_groups
                name = (
                    f"s{subtask:04d}/c{checkpoint_id:010d}-"
                    f"{state_file.old_subtask:04d}-{state_file.order:05d}.arrow"
                )
                link_or_copy(state_file.path, f"{channel_dir}/{name}")
                overlap = (max(mine.start, first), min(mine.end, last))
                queue.append(
                    Ready(name, state_file.rows, state_file.size, overlap, state_file.exact)
                )
            recovery.waiting[subtask] = queue
        recovery.admit(channels, force=not during_recovery)
        return recovery

    # --- what the loop asks -------------------------------------------------------------------------

    def filtering(self) -> list[int]:
        """Subtasks with restored rows still to be split out of a batch."""
        return [
            i for i, queue in self.waiting.items() if any(isinstance(e, Unfiltered) for e in queue)
        ]

    def not_ready(self, channels: list[Channel]) -> tuple[str, str] | None:
        """(subtask, why) when a trigger must be declined TASK_NOT_READY now, else None."""
        if self.during_recovery:
            pending = self.filtering()
            if pending:
                files = sum(len(b.files) for b in self.batches)
                return f"keyed-{pending[0]}", (
                    f"still filtering restored channel state of checkpoint {self.checkpoint_id} "
                    f"({files} files left for {len(pending)} subtasks)"
                )
            return None
        for i in self._processing_restored(channels):
            return f"keyed-{i}", (
                f"still processing restored channel state of checkpoint "
                f"{self.checkpoint_id} (execution.checkpointing.unaligned.during-recovery."
                "enabled is false: no checkpoint until recovery ends)"
            )
        return None

    def _processing_restored(self, channels: list[Channel]) -> list[int]:
        """Channels with restored segments still queued; the others are forgotten, so once
        recovery is over this costs nothing."""
        for i, last in list(self.restored_through.items()):
            segments = channels[i].segments
            if not segments or segments[0].sequence > last:
                del self.restored_through[i]
        return sorted(self.restored_through)

    def restored_queued(self, channels: list[Channel]) -> int:
        """Restored segments not processed yet: waiting, or queued in a channel."""
        queued = sum(
            sum(1 for s in channels[i].segments if s.sequence <= self.restored_through[i])
            for i in self._processing_restored(channels)
        )
        return queued + sum(len(queue) for queue in self.waiting.values())

    def holds_input(self) -> bool:
        """New input waits while restored segments are still to enter the channels."""
        return any(self.waiting.values())

    def spilled_segments(self, subtask: int) -> list[Segment]:
        """The filtered segments of ``subtask`` not in its channel yet: part of an unaligned
        snapshot's channel state (all of them precede any barrier)."""
        return [
            Segment(0, e.path, e.rows, e.size, key_groups=e.key_groups, exact=e.exact)
            for e in self.waiting.get(subtask, ())
            if isinstance(e, Ready)
        ]

    def channel_state(self, channel: Channel, checkpoint_id: int) -> list[Segment]:
        """An unaligned snapshot's channel state of ``channel``'s subtask: the segments before
        the barrier, then the restored ones still waiting to enter (they precede it too)."""
        return channel.before_barrier(checkpoint_id) + self.spilled_segments(channel.subtask)

    # --- the loop's work -----------------------------------------------------------------------------

    def admit(self, channels: list[Channel], force: bool = False) -> bool:
        """Moves ready segments into their channels, in order, while each has room (all of them
        when ``force``); true when any moved."""
        moved = False
        for i, queue in self.waiting.items():
            channel = channels[i]
            while queue and isinstance(queue[0], Ready) and (force or not channel.full):
                entry = queue.popleft()
                assert isinstance(entry, Ready)
                segment = channel.append_restored(
                    entry.path, entry.rows, entry.size, entry.key_groups, entry.exact
                )
                self.restored_through[i] = segment.sequence
                moved = True
        for i in [i for i, queue in self.waiting.items() if not queue]:
            del self.waiting[i]
        return moved

    def next_filters(
        self, channel_dir: str, max_parallelism: int, parallelism: int, first: bool
    ) -> list[FilterTask]:
        """Tasks for the next filter job: the first takes each subtask's first batch (every
        subtask gets rows to process early), a later one every batch left."""
        if first:
            chosen = {
                id(entry.batch): entry.batch
                for queue in self.waiting.values()
                for entry in [next((e for e in queue if isinstance(e, Unfiltered)), None)]
                if entry is not None
            }
            batches = sorted(chosen.values(), key=lambda b: b.number)
        else:
            batches = [b for b in self.batches if not b.in_flight]
        tasks = []
        for batch in batches:
            batch.in_flight = True
            files = [(f.path, f.key_groups) for f in batch.files]
            prefix = f"r{self.checkpoint_id:010d}-{batch.number:06d}"
            sizes = tuple(f.size for f in batch.files)
            tasks.append(
                FilterTask(
                    batch.number, files, max_parallelism, parallelism, channel_dir, prefix, sizes
                )
            )
        return tasks

    def step(
        self, channels: list[Channel], channel_dir: str, max_parallelism: int,
        submit: Callable[[list[FilterTask]], Future[list[FilterResult]]],
    ) -> bool:  # fmt: skip
        """Applies finished filter jobs, admits what has room, and at the start submits the
        filter jobs. True when anything changed."""
        changed = False
        arrived = 0.0  # the newest arrival applied here; earlier steps' came before this step
        for future in [f for f in self.futures if f.done()]:
            self.futures.remove(future)
            # a done future may not have run its callback yet: then it arrived just now
            arrived = max(arrived, self.arrivals.pop(id(future), time.monotonic()))
            for result in future.result():  # a failure fails the job here
                self._split(result, channels)
            changed = True
            if not self.batches:
                self.filter_ended = arrived
                log.info(
                    "checkpoint %d's channel state filtered: %d rows kept of %d bytes read, %d "
                    "segments spilled while channels were full; checkpoints are taken from now on",
                    self.checkpoint_id, self.filtered_rows, self.read_bytes, self.spilled,
                )  # fmt: skip
            crash_point("during-recovery")
        changed |= self.admit(channels)
        if self.filter_started is None and self.batches:
            # two jobs at once: the first splits each subtask's first batch, so processing
            # starts early; the second all the rest (one Spark job's fixed cost, not one per
            # batch), on the cores the first leaves, not after it
            self.filter_started = time.monotonic()
            log.info(
                "checkpoint %d's channel state: splitting %d runs of restored files (%.1f MB)",
                self.checkpoint_id, len(self.batches), sum(b.size for b in self.batches) / 2**20,
            )  # fmt: skip
            for first in (True, False):
                tasks = self.next_filters(channel_dir, max_parallelism, len(channels), first)
                if tasks:
                    future = submit(tasks)
                    future.add_done_callback(self._arrived)
                    self.futures.append(future)
            changed = True
        return changed

    def _arrived(self, future: Future[list[FilterResult]]) -> None:
        self.arrivals[id(future)] = time.monotonic()

    def _split(self, result: FilterResult, channels: list[Channel]) -> None:
        batch = next(b for b in self.batches if b.number == result.batch)
        self.batches.remove(batch)
        self.read_bytes += result.read_bytes
        places: dict[int, int] = {}  # each subtask's entry for this batch (one, in order)
        for i, queue in self.waiting.items():
            for k, entry in enumerate(queue):
                if isinstance(entry, Unfiltered) and entry.batch is batch:
                    places[i] = k
                    break
        if not set(result.outputs) <= set(places):
            raise RuntimeError(
                f"split of restored channel state gave rows to subtasks "
                f"{sorted(set(result.outputs) - set(places))} that do not own any file of it"
            )
        for subtask, index in places.items():
            queue = self.waiting[subtask]
            output = result.outputs.get(subtask)
            if output is None:
                del queue[index]
                continue
            name, rows, size = output
            self.filtered_rows += rows
            queue[index] = Ready(name, rows, size, None)
            if index > 0 or channels[subtask].full:
                self.spilled += 1
