"""Per-subtask input channels between stage 1 and stage 2: the driver's log of segments.

A segment is an immutable Arrow IPC file that a stage-1 task wrote for one stage-2 subtask
(under the channel storage: the agent's local disk on a local master, shared storage on a
cluster); the driver keeps only its metadata (path, rows, bytes, the source partition and the
offset its fetch started at), never its records. A channel with more than its capacity queued
reports itself full, and the agent stops fetching (backpressure) until stage 2 has drained it.

Barriers are positions in the log: the barrier of checkpoint n sits after every segment that was
queued when n was triggered. Stage 2 never takes segments past the oldest barrier, so a subtask
is aligned for n when everything before n's barrier has been processed. An unaligned snapshot
does not wait: the segments before the barrier are its channel state (`before_barrier`).
Consumed segments' files are deleted unless a snapshot still references them (`pin`).

Watermarks are positions in the log too (`mark`): each fetch's watermark goes after the segments
it queued, in every channel, so a subtask's watermark (`watermark`) covers what it has processed
and no more; a mark behind a barrier waits for the barrier, as Flink's watermarks travel behind
barriers in a channel.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sparkpoint.agent.state.backend import delete_files
from sparkpoint.agent.time.strategy import MAX_WATERMARK, MIN_WATERMARK
from sparkpoint.agent.time.watermarks import SourceWatermarks

DEFAULT_CAPACITY_BYTES = 256 * 1024 * 1024
"""Per channel, queued segment bytes above which the source stops fetching (backpressure)."""


@dataclass(frozen=True)
class Segment:
    sequence: int
    path: str
    """The segment's file, relative to the channel directory."""
    rows: int
    size: int
    source: tuple[str, int] | None = None
    """The source partition its records came from, and the offset its fetch started at: an
    at-least-once snapshot re-reads from there whatever is still queued."""
    first_offset: int = 0
    key_groups: tuple[int, int] | None = None
    """The key groups whose rows in the file belong to this channel; None: all of them (a
    segment of restored channel state may hold rows of key groups other subtasks own now)."""
    exact: bool = True
    """Every row of the file lies within ``key_groups`` (false only for restored files of a
    snapshot written before channel state recorded it: they may hold other subtasks' rows)."""
    event_time_before: int | None = None
    """The source partition's highest event time before the fetch (None: none yet): where its
    watermark stands when a checkpoint's cut rewinds the partition to ``first_offset``."""


@dataclass
class Channel:
    subtask: int
    capacity: int = DEFAULT_CAPACITY_BYTES
    segments: deque[Segment] = field(default_factory=deque)
    barriers: deque[tuple[int, int]] = field(default_factory=deque)
    """(checkpoint id, sequence of the last segment before the barrier), oldest first."""
    queued_bytes: int = 0
    appended_bytes: int = 0
    watermark: int = MIN_WATERMARK
    """The subtask's watermark: the newest mark among what stage 2 has processed."""
    marks: deque[tuple[int, int]] = field(default_factory=deque)
    """(sequence, watermark) of marks not yet reached, both increasing."""
    restored_mark: int | None = None
    """A restored snapshot's watermark after its channel state: marked once that state has
    entered the channel (`rounds.Rounds.watermarks`)."""
    _sequence: int = 0

    def append(
        self,
        path: str,
        rows: int,
        size: int,
        source: tuple[str, int] | None = None,
        first_offset: int = 0,
        key_groups: tuple[int, int] | None = None,
        exact: bool = True,
        event_time_before: int | None = None,
    ) -> Segment:
        self._sequence += 1
        segment = Segment(
            self._sequence, path, rows, size, source, first_offset, key_groups, exact,
            event_time_before,
        )  # fmt: skip
        self.segments.append(segment)
        self.queued_bytes += size
        self.appended_bytes += size
        return segment

    def append_restored(
        self, path: str, rows: int, size: int, key_groups: tuple[int, int] | None = None,
        exact: bool = True,
    ) -> Segment:  # fmt: skip
        """Appends a segment of restored channel state: it precedes everything new, so every
        barrier placed meanwhile moves behind it (no new input is queued while restored segments
        still come in: `recovery.ChannelRecovery` holds stage 1 back)."""
        segment = self.append(path, rows, size, key_groups=key_groups, exact=exact)
        self.barriers = deque(
            (checkpoint_id, segment.sequence) for checkpoint_id, _ in self.barriers
        )
        if self.marks:  # the restored watermark applies after the restored records
            self.marks = deque([(segment.sequence, self.marks[-1][1])])
        return segment

    # --- watermarks ---------------------------------------------------------------------------------

    def mark(self, watermark: int) -> None:
        """A watermark after everything queued so far (kept only when it moves forward)."""
        latest = self.marks[-1][1] if self.marks else self.watermark
        if watermark > latest:
            self._sequence += 1
            self.marks.append((self._sequence, watermark))

    def watermark_at(self, position: int) -> int:
        """The subtask's watermark once everything up to ``position`` is processed."""
        reached = self.watermark
        for sequence, watermark in self.marks:
            if sequence > position:
                break
            reached = watermark
        return max(reached, self.watermark)

    def reach(self, taken: list[Segment]) -> int:
        """How far a stage-2 part that takes ``taken`` gets: up to the next segment it leaves
        (the marks in between are reached too), never past the oldest barrier."""
        last = taken[-1].sequence if taken else self._sequence
        if not taken and self.segments:
            last = self.segments[0].sequence - 1
        after = next((s.sequence for s in self.segments if s.sequence > last), None)
        position = after - 1 if after is not None else self._sequence
        return min(position, self.barriers[0][1]) if self.barriers else position

    def advance(self, position: int) -> int:
        """Stage 2 processed everything up to ``position``: the subtask's watermark moves to
        the marks it reached."""
        self.watermark = self.watermark_at(position)
        while self.marks and self.marks[0][0] <= position:
            self.marks.popleft()
        return self.watermark

    @property
    def full(self) -> bool:
        return self.queued_bytes >= self.capacity

    def free_bytes(self) -> int:
        return max(0, self.capacity - self.queued_bytes)

    def add_barrier(self, checkpoint_id: int, after: int | None = None) -> None:
        """Places checkpoint ``checkpoint_id``'s barrier after the segment numbered ``after``
        (default: after the last one queued). Barriers stay in the order they were placed."""
        position = self._sequence if after is None else after
        if self.barriers and position < self.barriers[-1][1]:
            raise ValueError(f"barrier {checkpoint_id} would overtake {self.barriers[-1][0]}")
        self.barriers.append((checkpoint_id, position))

    def cut(self, taken: list[Segment]) -> tuple[int, list[Segment], list[Segment]]:
        """The earliest place a barrier can go now: after the segments a stage-2 round in flight
        took (``taken``), or before everything queued when none is in flight. Returns that
        sequence number, the segments before it and those after it."""
        if taken:
            last = taken[-1].sequence
        else:
            last = self.segments[0].sequence - 1 if self.segments else self._sequence
        before = [s for s in self.segments if s.sequence <= last]
        return last, before, [s for s in self.segments if s.sequence > last]

    def take(self, max_rows: int) -> list[Segment]:
        """Segments for the next stage-2 batch: in order, never past the oldest barrier, at most
        ``max_rows`` rows (at least one segment when any is available)."""
        limit = self.barriers[0][1] if self.barriers else None
        taken: list[Segment] = []
        rows = 0
        for segment in self.segments:
            if limit is not None and segment.sequence > limit:
                break
            if taken and rows + segment.rows > max_rows:
                break
            taken.append(segment)
            rows += segment.rows
        return taken

    def consumed(self, segments: list[Segment]) -> list[Segment]:
        """Stage 2 committed these segments' output: they leave the channel (returned, for their
        files to be deleted)."""
        done = {s.sequence for s in segments}
        gone = []
        while self.segments and self.segments[0].sequence in done:
            segment = self.segments.popleft()
            self.queued_bytes -= segment.size
            gone.append(segment)
        return gone

    def aligned(self, checkpoint_id: int) -> bool:
        """Everything before checkpoint ``checkpoint_id``'s barrier has been processed."""
        for barrier_id, last in self.barriers:
            if barrier_id == checkpoint_id:
                return not self.segments or self.segments[0].sequence > last
        return False

    def before_barrier(self, checkpoint_id: int) -> list[Segment]:
        """The segments still queued before checkpoint ``checkpoint_id``'s barrier (all of them
        when it has none): an unaligned snapshot's channel state. Segments a stage-2 round is
        processing stay queued until it completes, so they are included."""
        limit = next(
            (last for barrier_id, last in self.barriers if barrier_id == checkpoint_id), None
        )
        return [s for s in self.segments if limit is None or s.sequence <= limit]

    def remove_barrier(self, checkpoint_id: int) -> None:
        self.barriers = deque(b for b in self.barriers if b[0] != checkpoint_id)

    def unprocessed_from(self) -> dict[tuple[str, int], int]:
        """Per source partition, the offset its oldest queued segment was fetched from."""
        oldest: dict[tuple[str, int], int] = {}
        for segment in self.segments:
            if segment.source is not None:
                offset = oldest.get(segment.source, segment.first_offset)
                oldest[segment.source] = min(offset, segment.first_offset)
        return oldest

    def clear(self) -> list[Segment]:
        """Everything queued leaves (a restart reads it again from the source)."""
        gone = self.consumed(list(self.segments))
        self.barriers.clear()
        self.marks.clear()
        return gone


@dataclass
class SegmentFiles:
    """Deletes the files of consumed segments (under ``directory``), except those a snapshot
    still references."""

    directory: str = ""
    pins: Counter[str] = field(default_factory=Counter)
    doomed: set[str] = field(default_factory=set)

    def pin(self, paths: Iterable[str]) -> None:
        for path in paths:
            self.pins[path] += 1

    def release(self, paths: Iterable[str]) -> None:
        free = []
        for path in paths:
            self.pins[path] -= 1
            if self.pins[path] <= 0:
                del self.pins[path]
                if path in self.doomed:
                    self.doomed.discard(path)
                    free.append(f"{self.directory}/{path}")
        delete_files(free)  # on an object store one bulk request

    def discard(self, segments: Iterable[Segment]) -> None:
        free = []
        for segment in segments:
            if segment.path in self.pins:
                self.doomed.add(segment.path)
            else:
                free.append(f"{self.directory}/{segment.path}")
        delete_files(free)  # on an object store one bulk request, not a DELETE per segment


Partition = tuple[str, int]


class WatermarkedSource(Protocol):
    watermarks: SourceWatermarks | None

    def finished(self) -> bool: ...


def mark_source_watermark(
    source: WatermarkedSource, channels: list[Channel], now: float
) -> int | None:
    """Marks the source's watermark now in every channel, after what each holds, and returns
    it (None without event time). Restored channels first get the watermark their snapshot
    stood at after its channel state. A bounded input that is read ends with `MAX_WATERMARK`,
    with a watermark strategy or without one, as Flink's sources end."""
    for channel in channels:
        if channel.restored_mark is not None:
            channel.mark(channel.restored_mark)
            channel.restored_mark = None
    clock = source.watermarks
    if clock is None:
        if source.finished():
            for channel in channels:
                channel.mark(MAX_WATERMARK)
        return None
    if source.finished() and not clock.ended:
        clock.end()
    watermark = clock.advance(now)
    for channel in channels:
        channel.mark(watermark)
    return watermark


def event_times_before(
    channels: list[Channel], positions: dict[Partition, int]
) -> dict[Partition, int | None]:
    """For each partition whose position in ``positions`` is where a queued segment's fetch
    started (a cut behind where reading stands), its highest event time before that fetch."""
    out: dict[Partition, int | None] = {}
    for channel in channels:
        for segment in channel.segments:
            source = segment.source
            if source is not None and positions.get(source) == segment.first_offset:
                out[source] = segment.event_time_before
    return out


def earliest_cut(
    channels: list[Channel], taken: dict[int, list[Segment]], positions: dict[Partition, int]
) -> tuple[list[int], dict[Partition, int]] | None:
    """The earliest consistent place for an aligned barrier: in each channel right after the
    segments the stage-2 round in flight took (``taken``, per channel; before everything
    queued when none is in flight), and the source positions that cut stands for: where the
    segments behind it were read from, else where reading stands (``positions``). Those
    segments are read again after a restore instead of being waited for, so the barrier is
    aligned as soon as the round in flight ends.

    None when no such cut exists: a fetch of a partition would lie on both sides of it (its
    records went to several channels, and only some were taken), or restored channel state is
    queued (it was not read from a source position)."""
    sequences: list[int] = []
    last_before: dict[Partition, int] = {}
    first_after: dict[Partition, int] = {}
    for i, channel in enumerate(channels):
        sequence, before, after = channel.cut(taken.get(i, []))
        sequences.append(sequence)
        for segments, side, pick in ((before, last_before, max), (after, first_after, min)):
            for segment in segments:
                if segment.source is None:
                    return None
                known = side.get(segment.source, segment.first_offset)
                side[segment.source] = pick(known, segment.first_offset)
    if any(last_before.get(p, -1) >= offset for p, offset in first_after.items()):
        return None
    return sequences, {**positions, **first_after}
