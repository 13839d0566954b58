"""Per-subtask input channels between stage 1 and stage 2.

A channel is a log of segments (Arrow IPC record batches produced by stage 1 for one stage-2
subtask), in arrival order. Segments stay in memory within the channel's memory budget; beyond it
they are spilled to files under the channel's spill directory (local disk by default). A channel
with more than its capacity queued reports itself full, and the agent stops fetching
(backpressure) until stage 2 has drained it.

Barriers are positions in the log: the barrier of checkpoint n sits after every segment that was
queued when n was triggered. Stage 2 never takes segments past the oldest barrier, so a subtask
is aligned for n when everything before n's barrier has been processed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MEMORY_BUDGET_BYTES = 64 * 1024 * 1024
"""Per channel. Records beyond it go to local disk; 64 MiB holds a few rounds of typical events."""

DEFAULT_CAPACITY_BYTES = 256 * 1024 * 1024
"""Per channel, memory and disk together: above it the source stops fetching (backpressure)."""


@dataclass
class Segment:
    sequence: int
    rows: int
    size: int
    data: bytes | None
    """In memory, or None when spilled to ``path``."""
    path: str | None = None
    source: tuple[str, int] | None = None
    """The source partition its records came from, and the offset its fetch started at: an
    at-least-once snapshot re-reads from there whatever is still queued."""
    first_offset: int = 0

    def payload(self) -> bytes | str:
        """What a stage-2 task needs: the bytes, or the spill file to read."""
        if self.data is not None:
            return self.data
        assert self.path is not None
        return self.path


@dataclass
class Channel:
    subtask: int
    spill_dir: Path
    memory_budget: int = DEFAULT_MEMORY_BUDGET_BYTES
    capacity: int = DEFAULT_CAPACITY_BYTES
    segments: deque[Segment] = field(default_factory=deque)
    barriers: deque[tuple[int, int]] = field(default_factory=deque)
    """(checkpoint id, sequence of the last segment before the barrier), oldest first."""
    in_memory: int = 0
    on_disk: int = 0
    spilled_total: int = 0
    _sequence: int = 0

    def append(
        self, data: bytes, rows: int, source: tuple[str, int] | None = None, first_offset: int = 0
    ) -> Segment:
        self._sequence += 1
        segment = Segment(self._sequence, rows, len(data), data, None, source, first_offset)
        if self.in_memory + len(data) > self.memory_budget:
            self._spill(segment)
        else:
            self.in_memory += len(data)
        self.segments.append(segment)
        return segment

    def _spill(self, segment: Segment) -> None:
        assert segment.data is not None
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = (
            self.spill_dir / f"seg-{self.subtask}-{segment.sequence}-{uuid.uuid4().hex[:6]}.arrow"
        )
        path.write_bytes(segment.data)
        segment.path, segment.data = str(path), None
        self.on_disk += segment.size
        self.spilled_total += segment.size

    @property
    def queued_bytes(self) -> int:
        return self.in_memory + self.on_disk

    @property
    def full(self) -> bool:
        return self.queued_bytes >= self.capacity

    def free_bytes(self) -> int:
        return max(0, self.capacity - self.queued_bytes)

    def add_barrier(self, checkpoint_id: int) -> None:
        self.barriers.append((checkpoint_id, self._sequence))

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

    def consumed(self, segments: list[Segment]) -> None:
        """Stage 2 committed these segments' output: they leave the channel."""
        done = {s.sequence for s in segments}
        while self.segments and self.segments[0].sequence in done:
            segment = self.segments.popleft()
            if segment.data is not None:
                self.in_memory -= segment.size
            else:
                self.on_disk -= segment.size
                if segment.path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(segment.path)

    def aligned(self, checkpoint_id: int) -> bool:
        """Everything before checkpoint ``checkpoint_id``'s barrier has been processed."""
        for barrier_id, last in self.barriers:
            if barrier_id == checkpoint_id:
                return not self.segments or self.segments[0].sequence > last
        return False

    def remove_barrier(self, checkpoint_id: int) -> None:
        self.barriers = deque(b for b in self.barriers if b[0] != checkpoint_id)

    def unprocessed_from(self) -> dict[tuple[str, int], int]:
        """Per source partition, the offset its oldest queued segment was fetched from."""
        oldest: dict[tuple[str, int], int] = {}
        for segment in self.segments:
            if segment.source is not None:
                oldest[segment.source] = min(
                    oldest.get(segment.source, segment.first_offset), segment.first_offset
                )
        return oldest

    def clear(self) -> None:
        self.consumed(list(self.segments))
        self.barriers.clear()
