"""The job's rounds. A round is one Spark job whose tasks run both stages: stage 2 (the keyed
function over the segments the channels hold and the key groups' state) and stage 1 (read the
sources, map, key groups, segments into the channels for the next round). One round is in
flight at a time; the loop plans and collects it; a collected round's outcome goes back to the
loop, which hands it on (a round never touches checkpoints or the sink's epochs).

- Stage 2 takes each channel's segments up to its oldest barrier (at most
  ``max_rows_per_round`` rows): a part per subtask with work.
- Stage 1 plans each source partition up to the end it has now, within the source's bounds per
  round (the source reader's `plan`): a part per source subtask; none while a channel is full
  (backpressure) or restored channel state waits to enter the channels.
- Watermarks (when the source declares event time) follow the segments: after a fetch's
  segments, its watermark is marked in every channel (`watermarks`); a stage-2 part runs with
  its subtask's watermark and moves it to the marks its segments reach.
- When the parts are more than the cores, a task runs a stage-2 part and then a stage-1 part
  (`RoundTask`); otherwise each part is a task. One job per round, not one per stage: a
  PySpark job costs 35-50 ms before its first task runs, each task some more, and two stages'
  jobs in flight together queued for the same cores (`bench/latency.py`). On resident tasks
  a part costs no job, and each stage is a call of its own, stage 2's parts queued first: its
  results are collected as soon as its parts end (`calls`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field, replace
from typing import Any

from sparkpoint.agent.control.progress import Progress
from sparkpoint.agent.formats import ValueFormat
from sparkpoint.agent.job import (
    EVENT_TIME,
    PROCESSING_TIME,
    KafkaSource,
    KeyedFunction,
    MapFunction,
    Source,
    has_timers,
)
from sparkpoint.agent.rounds.calls import RoundCalls
from sparkpoint.agent.rounds.channels import (
    Channel,
    Segment,
    SegmentFiles,
    mark_source_watermark,
)
from sparkpoint.agent.rounds.debloat import Debloater
from sparkpoint.agent.rounds.fetch import FetchResult, FetchTask
from sparkpoint.agent.rounds.initial import InitialState
from sparkpoint.agent.rounds.process import ProcessResult, ProcessTask, output_file
from sparkpoint.agent.sinks import Emit
from sparkpoint.agent.sources import Partition, PlannedRead
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.spark.jobs import SparkJobs
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.agent.state.runs import SubtaskState
from sparkpoint.common.kafka_config import Frozen
from sparkpoint.common.keygroups import KeyGroupRange

log = logging.getLogger(__name__)

Reader = KafkaSourceReader | FileSourceReader


@dataclass(frozen=True)
class RoundSettings:
    """What every round of the job is made of."""

    job_id: str
    bootstrap: str
    source: Source
    value_format: ValueFormat
    map_function: MapFunction
    keyed_function: KeyedFunction
    key: str
    max_parallelism: int
    ranges: list[KeyGroupRange]
    channel_dir: str
    state_dir: str
    sink_dir: str
    max_rows_per_round: int
    source_properties: Frozen = ()
    """The Kafka source's client properties, for the stage-1 tasks that read it."""
    debloat_target_ms: int | None = None
    """Buffer debloating's target, when it is on: bounds each round's reads (`rounds.debloat`)."""
    debloat_samples: int = 20
    round_interval_s: float = 0.0
    """``execution.buffer-timeout.interval``: without a backlog, rounds start at most this often
    (`Rounds.pause_left`); 0: back to back."""

    @property
    def parallelism(self) -> int:
        return len(self.ranges)


@dataclass
class Processed:
    """What a collected stage-2 round did: for the loop to hand on."""

    outputs: list[tuple[int, str]] = field(default_factory=list)
    """(subtask, staged output file) of an exactly-once sink."""
    bytes_per_subtask: dict[int, int] = field(default_factory=dict)
    """Bytes of segments each subtask consumed."""


def backlogs(source: Reader, planned: dict[Partition, PlannedRead]) -> dict[Partition, int | None]:
    """Per planned read, the records it may find: to its planned end, else to the source's
    end (a bounded source), else unknown."""
    found: dict[Partition, int | None] = {}
    for partition, read in planned.items():
        end = read.until if read.until is not None else source.ends.get(partition)
        found[partition] = end - source.positions[partition] if end is not None else None
    return found


class Rounds:
    def __init__(
        self,
        settings: RoundSettings,
        jobs: SparkJobs,
        progress: Progress,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.progress = progress
        self.calls = RoundCalls(
            settings.job_id, settings.keyed_function, settings.map_function, jobs, wake
        )
        self.fetching: Future[list[FetchResult]] | None = None
        """The stage-1 part of the round in flight, when it has one."""
        self.processing: Future[list[ProcessResult]] | None = None
        """The stage-2 part of the round in flight, when it has one."""
        self.round: tuple[int, dict[int, list[Segment]]] | None = None
        self.reaches: dict[int, int] = {}
        """How far in its channel each subtask's stage-2 part in flight gets (its marks)."""
        self.asked: dict[int, SubtaskState] = {}
        """What the round in flight told each subtask's task of its state."""
        """The stage-2 part in flight: its version and the segments it took, per subtask."""
        self.fetches = 0
        self.rounds = 0
        """Stage-2 parts so far: number state versions and staged output files."""
        self.input_bytes = 0
        """Bytes of the records stage 1 read (values), over every attempt."""
        self.processed_rows = 0
        """Rows stage 2 processed, over every attempt."""
        self.state_bytes_written = 0
        """Bytes of the key-group state files stage 2 wrote, over every attempt."""
        self.timers_fired = 0
        """Timers stage 2 fired, over every attempt."""
        self.firing_seconds = 0.0
        """Wall time of the rounds that fired timers, submission to collection."""
        self.firing_spans: list[tuple[int, int]] = []
        """Those rounds' spans, ms since the epoch (what a benchmark sets checkpoints beside)."""
        self.submitted = 0.0
        self.initial: InitialState | None = None
        """The initial state the round in flight applies (`rounds.initial`)."""
        target = settings.debloat_target_ms
        self.debloat = Debloater(target, settings.debloat_samples) if target else None
        self.read_bounds: dict[Partition, int] = {}
        """The bounds debloating set on the read in flight, per partition (empty: none)."""
        self.bounded_reads: deque[list[tuple[int, int]]] = deque(maxlen=256)
        """Recent reads debloating bounded: per partition, (its bound, the records it read)."""
        self.read_capped = False
        """The last read stopped at a bound somewhere: a backlog is there."""
        self.busy = False
        """The stage-2 part in flight took its segments from a backlog."""
        self.read_bounded = False
        """The last read stopped at a bound (records or time), not at what had arrived."""
        self.backlog = False
        """A bound stopped the last read, or the last stage-2 part left segments behind: the
        next round is not paced (`pause_left`)."""

    def pause_left(self) -> float:
        """Seconds before the next round may start. As Flink sends a buffer when it is full or
        its timeout passed, a round starts at once when there is a backlog (the last read
        stopped at a bound, or the last stage-2 part left segments behind), else at most once
        per ``round_interval_s``: what arrived meanwhile makes one round, not a round each
        (each costs a Spark job and a pass over the state it touches)."""
        interval = self.settings.round_interval_s
        if not interval or self.backlog or self.read_bounded:
            return 0.0
        return max(0.0, self.submitted + interval - time.monotonic())

    def in_flight(self) -> list[Future[Any]]:
        return [f for f in (self.fetching, self.processing) if f is not None]

    def taken(self) -> dict[int, list[Segment]]:
        """The segments the stage-2 part in flight took, per subtask."""
        return self.round[1] if self.round is not None else {}

    def start(
        self,
        channels: list[Channel],
        backend: StateBackend,
        emit: Emit | None,
        source: Reader,
        held: bool,
        end_of_input: bool = False,
        initial: InitialState | None = None,
    ) -> bool:
        """Plans the next round and submits it, when none is in flight: stage 2 over what the
        channels hold, stage 1 unless ``held`` (restored channel state goes first), a channel is
        full (backpressure) or this is the end-of-input round. True when it has a stage-2 part."""
        if self.in_flight() or (self.pause_left() > 0 and not end_of_input):
            return False
        if not held:
            self.watermarks(source, channels)
        process = self._plan_process(channels, backend, emit, end_of_input, initial)
        fetch = [] if end_of_input else self._plan_fetch(source, channels, held)
        if not process and not fetch:
            return False
        self.processing, self.fetching = self.calls.submit(process, fetch)
        self.submitted = time.monotonic()
        return bool(process)

    # --- stage 1 ---------------------------------------------------------------------------------

    def _plan_fetch(
        self, source: Reader, channels: list[Channel], held: bool
    ) -> list[list[FetchTask]]:
        """The round's stage-1 parts, one per source subtask with partitions to read."""
        full = any(c.full for c in channels)
        self.progress.held(full)
        if full or held:
            return []
        planned = source.plan()
        self.progress.seen_ends(source.highs.items())
        if source.watermarks is not None:  # alignment: partitions far ahead wait
            finished = [p for p, end in source.ends.items() if source.positions[p] >= end]
            paused = source.watermarks.paused(time.monotonic(), finished)
            planned = {p: read for p, read in planned.items() if p not in paused}
        if not planned:
            return []
        self.fetches += 1
        settings = self.settings
        self.read_bounds = self.debloat.bounds(backlogs(source, planned)) if self.debloat else {}
        if self.read_bounds:
            planned = {
                p: replace(r, max_records=min(r.max_records, self.read_bounds[p]))
                for p, r in planned.items()
            }
        bounds = source.bounds
        max_duration_s = (
            bounds.duration_ms / 1000
            if bounds is not None and isinstance(settings.source, KafkaSource)
            else 0.0
        )
        strategy = settings.source.watermark_strategy
        column = strategy.column if strategy is not None else None
        kafka_timestamps = (
            strategy is not None
            and strategy.timestamp_column is None
            and isinstance(settings.source, KafkaSource)
        )
        by_subtask: dict[int, list[FetchTask]] = {}
        for (topic, partition), read in planned.items():
            by_subtask.setdefault(source.owner((topic, partition)), []).append(
                FetchTask(
                    settings.bootstrap, topic, partition, source.positions[(topic, partition)],
                    source.ends.get((topic, partition)), read.max_records, settings.key,
                    settings.max_parallelism, settings.parallelism, settings.source.format,
                    settings.channel_dir, self.fetches, settings.value_format, read.until,
                    max_duration_s, settings.source_properties, column, kafka_timestamps,
                )
            )  # fmt: skip
        return list(by_subtask.values())

    def collect_fetch(self, wait: bool, source: Reader, channels: list[Channel]) -> int:
        """Applies a finished stage-1 round: its segments join the channels (behind any barrier
        placed meanwhile: they belong to the next epoch) and the source positions advance.
        Returns the records it read (0 too when none was finished)."""
        fetching = self.fetching
        if fetching is None or (not wait and not fetching.done()):
            return 0
        self.fetching = None
        fetched = 0
        clock = source.watermarks
        now = time.monotonic()
        results = fetching.result()  # a failure of stage 1 fails the job here
        for result in results:
            for offset, reason in result.malformed:
                log.warning(
                    "malformed record skipped: %s[%d]@%d: %s",
                    result.topic, result.partition, offset, reason,
                )  # fmt: skip
            partition = (result.topic, result.partition)
            started_at = source.positions[partition]
            before = clock.highest.get(partition) if clock is not None else None
            for subtask, name, rows, size in result.segments:
                channels[subtask].append(
                    name, rows, size, partition, started_at, event_time_before=before
                )
            if clock is not None:
                clock.observe(partition, result.highest_event_time, now)
            source.positions[partition] = result.next_offset
            source.capped[partition] = result.capped
            self.progress.read(partition, result.next_offset, result.records)
            fetched += result.records
            self.input_bytes += result.bytes_read
        self.watermarks(source, channels)
        self.read_capped = any(r.capped for r in results)
        self.read_bounded = any(r.bounded for r in results)
        if self.debloat is not None:
            self.debloat.read(fetched, sum(rows for r in results for _, _, rows, _ in r.segments))
        if self.read_bounds:
            self.bounded_reads.append(
                [(self.read_bounds[(r.topic, r.partition)], r.records) for r in results]
            )
        return fetched

    def watermarks(self, source: Reader, channels: list[Channel]) -> None:
        """The source's watermark now, marked in every channel after what it holds."""
        watermark = mark_source_watermark(source, channels, time.monotonic())
        if watermark is not None:
            self.progress.watermarked(watermark, [c.watermark for c in channels])

    # --- stage 2 ---------------------------------------------------------------------------------

    def _plan_process(
        self, channels: list[Channel], backend: StateBackend, emit: Emit | None,
        end_of_input: bool, initial: InitialState | None,
    ) -> list[ProcessTask]:  # fmt: skip
        """The round's stage-2 parts, one per subtask with segments to process; at the end of a
        bounded input, every subtask runs once more (its end-of-input hook); a fresh start's
        first round, every subtask with a share of the initial state."""
        max_rows = self.settings.max_rows_per_round
        taken = {i: c.take(max_rows) for i, c in enumerate(channels)}
        left_behind = any(len(c.segments) > len(taken[i]) for i, c in enumerate(channels))
        self.busy = self.read_capped or left_behind
        self.backlog = self.read_bounded or left_behind
        reaches = {i: c.reach(taken[i]) for i, c in enumerate(channels)}
        due: dict[int, tuple[list[int], list[int]]] = {}
        now_ms = int(time.time() * 1000)
        if has_timers(self.settings.keyed_function):
            for i, channel in enumerate(channels):
                after, groups = channel.watermark_at(reaches[i]), self.settings.ranges[i]
                due[i] = (
                    backend.timers.due(groups, after),
                    backend.processing_timers.due(groups, now_ms),
                )
        work = [i for i, segments in taken.items() if segments or any(due.get(i, ((), ())))]
        if end_of_input:
            work = list(range(self.settings.parallelism))
        first = initial is not None and not initial.submitted
        if first and initial is not None:
            work = sorted({*work, *initial.segments})
            initial.submitted = True
            self.initial = initial
        for i, channel in enumerate(channels):
            if i not in work:  # nothing to process or fire: its watermark moves on at once
                channel.advance(reaches[i])
        if not work:
            return []
        self.rounds += 1
        self.round = (self.rounds, taken)
        self.reaches = {i: reaches[i] for i in work}
        tasks = []
        for i in work:
            watermarks = (channels[i].watermark, channels[i].watermark_at(reaches[i]))
            timer_groups = due.get(i, ([], []))
            task = self._process_task(
                i, taken[i], backend, emit, end_of_input, watermarks, timer_groups, now_ms
            )
            if first and initial is not None:
                task = replace(task, initial_segment=initial.segments.get(i))
            tasks.append(task)
        self.asked = {task.subtask: task.state for task in tasks}
        return tasks

    def _process_task(
        self, subtask: int, segments: list[Segment], backend: StateBackend, emit: Emit | None,
        end_of_input: bool, watermarks: tuple[int, int], timer_groups: tuple[list[int], list[int]],
        now_ms: int,
    ) -> ProcessTask:  # fmt: skip
        settings = self.settings
        seq = backend.seq(self.rounds)
        state = backend.subtask_state(settings.ranges[subtask], seq, subtask, time.monotonic())
        return ProcessTask(
            subtask, settings.channel_dir, [s.path for s in segments], state,
            backend.run_path(seq, subtask), output_file(settings.sink_dir, self.rounds, subtask),
            end_of_input, [s.key_groups for s in segments], settings.key, emit, *watermarks,
            timer_groups[0], now_ms, timer_groups[1],
        )  # fmt: skip

    def collect_process(
        self,
        wait: bool,
        channels: list[Channel],
        backend: StateBackend,
        segment_files: SegmentFiles,
    ) -> Processed | None:
        """Applies a finished stage-2 round: new state versions, consumed segments; returns its
        staged output and the bytes each subtask consumed (None when none was finished). A
        snapshot taken while the round ran holds the state before it and the round's segments
        as channel state, so its output belongs after it."""
        processing = self.processing
        if processing is None or (not wait and not processing.done()):
            return None
        assert self.round is not None
        version, taken = self.round
        self.processing = None
        self.round = None
        done = Processed()
        now = time.monotonic()
        for result in processing.result():  # a failure of stage 2 fails the job here
            asked = self.asked[result.subtask]
            backend.install(asked, result.written, backend.seq(version), now)
            for label, index in (
                (EVENT_TIME, backend.timers),
                (PROCESSING_TIME, backend.processing_timers),
            ):
                index.update(
                    result.timers_exact.get(label, {}), result.timers_lowered.get(label, {})
                )
            self.state_bytes_written += result.written.bytes
            self.timers_fired += result.timers_fired
            segment_files.discard(channels[result.subtask].consumed(taken[result.subtask]))
            channels[result.subtask].advance(self.reaches[result.subtask])
            done.bytes_per_subtask[result.subtask] = sum(s.size for s in taken[result.subtask])
            if result.output_path is not None:
                done.outputs.append((result.subtask, result.output_path))
            self.progress.emitted(result.output_rows)
        rows = sum(s.rows for segments in taken.values() for s in segments)
        self.processed_rows += rows
        if self.debloat is not None:
            self.debloat.observe(rows, now - self.submitted, self.busy)
        if self.initial is not None:  # every subtask ran on_initial_state: checkpoints may go
            self.initial.applied, self.initial = True, None
        if any(r.timers_fired for r in processing.result()):
            self.firing_seconds += now - self.submitted
            ended_ms = int(time.time() * 1000)
            self.firing_spans.append((ended_ms - int((now - self.submitted) * 1000), ended_ms))
        if self.settings.source.watermark_strategy is not None:
            source_watermark = self.progress.source_watermark
            self.progress.watermarked(source_watermark, [c.watermark for c in channels])
        return done

    # --- the end of an attempt -----------------------------------------------------------------------

    def settle(self, wait_s: float, others: Sequence[Future[Any]] = ()) -> None:
        """After a failure: the rounds in flight (and ``others``: splits of restored channel
        state) get ``wait_s`` to finish (their results are dropped), then what still runs is
        cancelled (a cancelled Spark task takes its Python worker with it, and the restarted
        job's first round would pay for new workers)."""
        running = [*self.in_flight(), *others]
        _, unfinished = wait(running, wait_s)
        if unfinished:
            self.jobs.cancel_open()
        for future in running:
            with contextlib.suppress(Exception):
                future.result()
        self.fetching = self.processing = None
        self.round = None
        self.initial = None  # the next attempt applies it again, or restores what has it

    def shutdown(self) -> None:
        self.calls.shutdown()
