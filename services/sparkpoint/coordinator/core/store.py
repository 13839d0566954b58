"""Completed checkpoints, their retention, the reference counts of their files, and the
checkpoint id counter's contract (its implementations hold state or talk to Kafka, so they live
in the service: `memory_counter`, `kafka_counter`).

Retention follows Flink's DefaultCompletedCheckpointStore and CheckpointSubsumeHelper: keep
``num_retained`` completed checkpoints, subsume the oldest first, never the latest one and never
the latest that is not a savepoint (the job restores from it). Savepoints count toward the number
but their files are never discarded.

Files are discarded only when nothing holds them any more (Flink's SharedStateRegistry, applied to
every file): a pending checkpoint holds the files its acknowledgements name, a retained checkpoint
holds all of its files, a completed savepoint holds its files for ever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sparkpoint.common.events import JobStatus, RetainedCheckpoint, SnapshotType
from sparkpoint.common.settings import ExternalizedRetention


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    checkpoint_id: int
    snapshot_type: SnapshotType
    periodic: bool
    trigger_ms: int
    completed_ms: int
    external_path: str
    state_size_bytes: int
    files: tuple[str, ...] = ()

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type.is_savepoint

    def to_record(self) -> RetainedCheckpoint:
        return RetainedCheckpoint(
            self.checkpoint_id,
            self.snapshot_type,
            self.periodic,
            self.trigger_ms,
            self.completed_ms,
            self.external_path,
            self.state_size_bytes,
            list(self.files),
        )

    @classmethod
    def from_record(cls, record: RetainedCheckpoint) -> CompletedCheckpoint:
        return cls(
            record.checkpoint_id,
            record.snapshot_type,
            record.periodic,
            record.trigger_timestamp,
            record.completed_timestamp,
            record.external_path,
            record.state_size_bytes,
            tuple(record.referenced_files),
        )


@dataclass(frozen=True, slots=True)
class Discard:
    """Files (and the checkpoint directory, when given) that nothing references any more."""

    checkpoint_id: int
    files: tuple[str, ...]
    directory: str | None
    reason: str


class FileRegistry:
    """Reference counts of state files: a file with no holder left is returned for discarding."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def acquire(self, paths: Iterable[str]) -> None:
        counts = self._counts
        for path in paths:
            counts[path] = counts.get(path, 0) + 1

    def release(self, paths: Iterable[str]) -> list[str]:
        """Drops one hold on each path; returns the paths nobody holds any more."""
        free = []
        counts = self._counts
        for path in paths:
            left = counts.get(path, 0) - 1
            if left > 0:
                counts[path] = left
            else:
                counts.pop(path, None)
                free.append(path)
        return free

    def unreferenced(self, paths: Iterable[str]) -> list[str]:
        return [path for path in paths if path not in self._counts]

    def holders(self, path: str) -> int:
        return self._counts.get(path, 0)

    def __len__(self) -> int:
        return len(self._counts)


class DiscardGate:
    """Holds back what a checkpoint's end lets go while other checkpoints are pending, until each
    of them has ended; then lets go of what nothing took meanwhile.

    A pending checkpoint may reference shared files it has not acknowledged yet: the agent plans
    an incremental snapshot against the newest checkpoint it was told completed, which may have
    completed after the trigger, and be subsumed before the acknowledgement arrives (with more
    than one checkpoint in flight, or an abort that lets go of a reference it shared). Counting
    only acknowledged references, that file would be deleted under a checkpoint about to complete
    (the class of Spark's SPARK-55892). Here no file is deleted while a checkpoint that might
    still reference it is pending: by construction, whatever the order of completions, aborts
    and acknowledgements. Pure; ``pending`` is the live view of the checkpoints in flight."""

    def __init__(self, registry: FileRegistry, pending: Mapping[int, object]) -> None:
        self.registry = registry
        self.pending = pending
        self._held: list[tuple[set[int], Discard]] = []

    def __len__(self) -> int:
        return len(self._held)

    def let_go(self, discards: Iterable[Discard]) -> list[Discard]:
        """What may be discarded now: ``discards`` unless checkpoints are pending (they are held
        until each of those has ended), and what was held and may go now (`released`). The
        checkpoint whose end lets go of them is no longer pending when this is called."""
        waiting = set(self.pending)
        ready: list[Discard] = []
        for discard in discards:
            if waiting:
                self._held.append((set(waiting), discard))
            else:
                ready.append(discard)
        return ready + self.released()

    def released(self) -> list[Discard]:
        """The held discards whose pending checkpoints have all ended, each with only the files
        no checkpoint took since (an acknowledgement that referenced one acquired it again)."""
        ready: list[Discard] = []
        still: list[tuple[set[int], Discard]] = []
        for waiting, discard in self._held:
            waiting &= self.pending.keys()
            if waiting:
                still.append((waiting, discard))
                continue
            free = tuple(self.registry.unreferenced(discard.files))
            if free or discard.directory:
                ready.append(
                    Discard(discard.checkpoint_id, free, discard.directory, discard.reason)
                )
        self._held = still
        return ready


@dataclass
class CompletedCheckpointStore:
    num_retained: int
    registry: FileRegistry = field(default_factory=FileRegistry)
    checkpoints: list[CompletedCheckpoint] = field(default_factory=list)
    """Oldest first."""

    def add(
        self, checkpoint: CompletedCheckpoint
    ) -> tuple[list[CompletedCheckpoint], list[Discard]]:
        """Adds a completed checkpoint whose files the caller already acquired; returns the
        subsumed checkpoints and what to discard."""
        self.checkpoints.append(checkpoint)
        return self._subsume()

    def set_num_retained(
        self, num_retained: int
    ) -> tuple[list[CompletedCheckpoint], list[Discard]]:
        self.num_retained = num_retained
        return self._subsume()

    def remove(self, checkpoint: CompletedCheckpoint) -> Discard:
        """Drops a checkpoint on request (periodic savepoint retention) and releases its files."""
        self.checkpoints = [c for c in self.checkpoints if c is not checkpoint]
        return self._release(checkpoint, "removed")

    def latest(self) -> CompletedCheckpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The latest retained checkpoint that is not a savepoint: what a failover restores."""
        return next((c for c in reversed(self.checkpoints) if not c.is_savepoint), None)

    def restore(self, retained: Iterable[CompletedCheckpoint]) -> None:
        """After failover: the retained checkpoints as the checkpoint store topic had them."""
        for checkpoint in retained:
            self.checkpoints.append(checkpoint)
            self.registry.acquire(checkpoint.files)

    def shutdown(self, status: JobStatus, retention: ExternalizedRetention) -> list[Discard]:
        """The job ended: discard the retained checkpoints if the retention policy says so.
        Savepoints are never discarded."""
        if not retention.discards_on(status):
            return []
        discards = [
            self._release(c, f"job {status.name}") for c in self.checkpoints if not c.is_savepoint
        ]
        self.checkpoints = [c for c in self.checkpoints if c.is_savepoint]
        return discards

    def _subsume(self) -> tuple[list[CompletedCheckpoint], list[Discard]]:
        if len(self.checkpoints) <= self.num_retained:
            return [], []
        latest = self.checkpoints[-1]
        latest_checkpoint = self.latest_checkpoint()
        subsumed: list[CompletedCheckpoint] = []
        kept: list[CompletedCheckpoint] = []
        excess = len(self.checkpoints) - self.num_retained
        for checkpoint in self.checkpoints:
            if excess > 0 and checkpoint is not latest and checkpoint is not latest_checkpoint:
                subsumed.append(checkpoint)
                excess -= 1
            else:
                kept.append(checkpoint)
        self.checkpoints = kept
        discards = [self._release(c, "subsumed") for c in subsumed if not c.is_savepoint]
        return subsumed, discards

    def _release(self, checkpoint: CompletedCheckpoint, reason: str) -> Discard:
        free = self.registry.release(checkpoint.files)
        return Discard(checkpoint.checkpoint_id, tuple(free), checkpoint.external_path, reason)


# --- checkpoint id counter ---------------------------------------------------------------------


class CheckpointIdCounter(Protocol):
    """Hands out checkpoint ids: starts at 1, strictly increasing, never reused, across restarts
    and coordinator failover. Every implementation passes tests/unit/test_checkpoint_id_counter.py."""

    def get_and_increment(self) -> int: ...

    def get(self) -> int:
        """The next id ``get_and_increment`` will return."""
        ...

    def set_count(self, count: int) -> None:
        """After a restore from checkpoint or savepoint n: ``set_count(n + 1)``. Never moves the
        counter backwards, so an id is never handed out twice."""
        ...

    def shutdown(self, status: JobStatus) -> None:
        """The job ended with ``status``; release what the counter holds."""
        ...
