"""Checkpoint statistics in the shape of Flink's REST API (``GET /jobs/:id/checkpoints`` and
``.../checkpoints/details/:id``): counts, a summary with percentiles, the latest completed /
savepoint / failed / restored checkpoint, and a bounded history with per-subtask details.

Recording costs nothing per acknowledgement: an entry keeps a reference to its pending
checkpoint's acknowledgements and derives sizes and durations when it is read.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.common.events import AcknowledgeCheckpoint, SnapshotType

HISTORY_SIZE = 10
"""Flink's ``web.checkpoints.history`` default: the checkpoints the history lists in detail."""

SUMMARY_WINDOW = 10_000
"""Percentiles are computed over the most recent completed checkpoints, as Flink's histogram
window does; min, max and average are over every completed checkpoint."""

IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"
FAILED = "FAILED"

SUMMARY_METRICS = (
    "state_size",
    "checkpointed_size",
    "end_to_end_duration",
    "processed_data",
    "persisted_data",
)
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))


def percentile(ordered: Sequence[float], p: float) -> float:
    """Commons Math's default estimate (what Flink reports): position p(n+1)/100, interpolated."""
    n = len(ordered)
    if n == 0:
        return 0.0
    position = p * (n + 1) / 100
    if position < 1:
        return float(ordered[0])
    if position >= n:
        return float(ordered[-1])
    lower = math.floor(position)
    fraction = position - lower
    return float(ordered[lower - 1] + fraction * (ordered[lower] - ordered[lower - 1]))


@dataclass
class Summary:
    """Statistics of one metric over completed checkpoints."""

    count: int = 0
    total: int = 0
    minimum: int | None = None
    maximum: int | None = None
    window: deque[int] = field(default_factory=lambda: deque(maxlen=SUMMARY_WINDOW))

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        self.minimum = value if self.minimum is None else min(self.minimum, value)
        self.maximum = value if self.maximum is None else max(self.maximum, value)
        self.window.append(value)

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.window)
        result: dict[str, Any] = {
            "min": self.minimum or 0,
            "max": self.maximum or 0,
            "avg": self.total // self.count if self.count else 0,
        }
        for name, p in PERCENTILES:
            result[name] = percentile(ordered, p)
        return result


@dataclass
class CheckpointEntry:
    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    subtasks: Sequence[str]
    acknowledgements: Mapping[str, AcknowledgeCheckpoint]
    unaligned: bool
    status: str = IN_PROGRESS
    end_ms: int | None = None
    external_path: str | None = None
    failure_message: str | None = None
    discarded: bool = False

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type.is_savepoint

    @property
    def is_unaligned(self) -> bool:
        """Taken unaligned by any subtask (one that starts aligned under an aligned-checkpoint
        timeout counts once it switched); before any acknowledgement, what was asked for."""
        if any(a.unaligned for a in self.acknowledgements.values()):
            return True
        return self.unaligned and not self.acknowledgements

    @property
    def latest_ack_ms(self) -> int:
        return max(
            (a.ack_timestamp for a in self.acknowledgements.values()), default=self.trigger_ms
        )

    def sum(self, attribute: str) -> int:
        return sum(getattr(a, attribute) for a in self.acknowledgements.values())

    def metric(self, name: str) -> int:
        if name == "end_to_end_duration":
            return max(0, self.latest_ack_ms - self.trigger_ms)
        attribute = {
            "state_size": "state_size_bytes",
            "checkpointed_size": "checkpointed_size_bytes",
            "processed_data": "processed_data_bytes",
            "persisted_data": "persisted_data_bytes",
        }[name]
        return self.sum(attribute)

    def checkpoint_type(self) -> str:
        if self.is_savepoint:
            return "SAVEPOINT" if self.snapshot_type is SnapshotType.SAVEPOINT else "SYNC_SAVEPOINT"
        return "UNALIGNED_CHECKPOINT" if self.is_unaligned else "CHECKPOINT"

    def to_json(self) -> dict[str, Any]:
        class_name = {
            IN_PROGRESS: ".PendingCheckpointStatistics",
            COMPLETED: ".CompletedCheckpointStatistics",
            FAILED: ".FailedCheckpointStatistics",
        }[self.status]
        entry: dict[str, Any] = {
            "className": class_name,
            "id": self.checkpoint_id,
            "status": self.status,
            "is_savepoint": self.is_savepoint,
            "savepointFormat": "CANONICAL" if self.is_savepoint else None,
            "trigger_timestamp": self.trigger_ms,
            "latest_ack_timestamp": self.latest_ack_ms if self.acknowledgements else -1,
            "checkpointed_size": self.metric("checkpointed_size"),
            "state_size": self.metric("state_size"),
            "end_to_end_duration": self.metric("end_to_end_duration"),
            "alignment_buffered": 0,
            "processed_data": self.metric("processed_data"),
            "persisted_data": self.metric("persisted_data"),
            "num_subtasks": len(self.subtasks),
            "num_acknowledged_subtasks": len(self.acknowledgements),
            "checkpoint_type": self.checkpoint_type(),
            "unaligned": self.is_unaligned,
            "tasks": {},
        }
        if self.status == COMPLETED:
            entry["external_path"] = self.external_path
            entry["discarded"] = self.discarded
        if self.status == FAILED:
            entry["external_path"] = None
            entry["failure_timestamp"] = self.end_ms
            entry["failure_message"] = self.failure_message
        return entry

    def details(self) -> dict[str, Any]:
        """The entry plus one record per subtask (Flink's SubtaskCheckpointStatistics)."""
        subtasks = []
        for index, subtask in enumerate(self.subtasks):
            ack = self.acknowledgements.get(subtask)
            if ack is None:
                subtasks.append(
                    {"index": index, "subtask_id": subtask, "status": "pending_or_failed"}
                )
                continue
            subtasks.append(
                {
                    "index": index,
                    "subtask_id": subtask,
                    "status": "completed",
                    "ack_timestamp": ack.ack_timestamp,
                    "end_to_end_duration": max(0, ack.ack_timestamp - self.trigger_ms),
                    "state_size": ack.state_size_bytes,
                    "checkpointed_size": ack.checkpointed_size_bytes,
                    "checkpoint": {"sync": ack.sync_duration_ms, "async": ack.async_duration_ms},
                    "alignment": {
                        "buffered": 0,
                        "processed": ack.processed_data_bytes,
                        "persisted": ack.persisted_data_bytes,
                        "duration": ack.alignment_duration_ms,
                    },
                    "unaligned_checkpoint": ack.unaligned,
                    "state_handles": len(ack.state_handles),
                }
            )
        return self.to_json() | {"subtasks": subtasks}


@dataclass(frozen=True)
class RestoredCheckpoint:
    checkpoint_id: int
    restore_ms: int
    is_savepoint: bool
    external_path: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id,
            "restore_timestamp": self.restore_ms,
            "is_savepoint": self.is_savepoint,
            "external_path": self.external_path,
        }


class CheckpointStatsTracker:
    def __init__(self, history_size: int = HISTORY_SIZE) -> None:
        self._history: deque[CheckpointEntry] = deque(maxlen=history_size)
        self._in_progress: dict[int, CheckpointEntry] = {}
        self.summaries = {name: Summary() for name in SUMMARY_METRICS}
        self.completed = 0
        self.failed = 0
        self.restored = 0
        self.latest_completed: CheckpointEntry | None = None
        self.latest_savepoint: CheckpointEntry | None = None
        self.latest_failed: CheckpointEntry | None = None
        self.latest_restored: RestoredCheckpoint | None = None

    @property
    def history_size(self) -> int:
        return self._history.maxlen or HISTORY_SIZE

    @property
    def in_progress(self) -> int:
        return len(self._in_progress)

    def on_triggered(
        self,
        checkpoint_id: int,
        snapshot_type: SnapshotType,
        trigger_ms: int,
        subtasks: Sequence[str],
        acknowledgements: Mapping[str, AcknowledgeCheckpoint],
        unaligned: bool,
    ) -> None:
        entry = CheckpointEntry(
            checkpoint_id, snapshot_type, trigger_ms, subtasks, acknowledgements, unaligned
        )
        self._in_progress[checkpoint_id] = entry
        self._history.appendleft(entry)

    def on_completed(self, checkpoint_id: int, end_ms: int, external_path: str) -> None:
        entry = self._in_progress.pop(checkpoint_id, None)
        if entry is None:
            return
        entry.status, entry.end_ms, entry.external_path = COMPLETED, end_ms, external_path
        self.completed += 1
        for name, summary in self.summaries.items():
            summary.add(entry.metric(name))
        if entry.is_savepoint:
            self.latest_savepoint = entry
        else:
            self.latest_completed = entry

    def on_failed(self, checkpoint_id: int, end_ms: int, message: str) -> None:
        entry = self._in_progress.pop(checkpoint_id, None)
        if entry is None:
            return
        entry.status, entry.end_ms, entry.failure_message = FAILED, end_ms, message
        self.failed += 1
        self.latest_failed = entry

    def on_discarded(self, checkpoint_id: int) -> None:
        for entry in self._history:
            if entry.checkpoint_id == checkpoint_id:
                entry.discarded = True

    def on_restored(
        self, checkpoint_id: int, restore_ms: int, is_savepoint: bool, external_path: str
    ) -> None:
        self.restored += 1
        self.latest_restored = RestoredCheckpoint(
            checkpoint_id, restore_ms, is_savepoint, external_path
        )

    def details(self, checkpoint_id: int) -> dict[str, Any] | None:
        for entry in self._history:
            if entry.checkpoint_id == checkpoint_id:
                return entry.details()
        return None

    def to_json(self) -> dict[str, Any]:
        """``GET /jobs/:id/checkpoints``."""

        def latest(entry: CheckpointEntry | None) -> dict[str, Any] | None:
            return None if entry is None else entry.to_json()

        return {
            "counts": {
                "restored": self.restored,
                "total": self.completed + self.failed + self.in_progress,
                "in_progress": self.in_progress,
                "completed": self.completed,
                "failed": self.failed,
            },
            "summary": {
                # Flink 1.x's alignment buffering, still answered by Flink 2.3: always 0 there too
                "alignment_buffered": Summary().to_json(),
                **{name: summary.to_json() for name, summary in self.summaries.items()},
            },
            "latest": {
                "completed": latest(self.latest_completed),
                "savepoint": latest(self.latest_savepoint),
                "failed": latest(self.latest_failed),
                "restored": None
                if self.latest_restored is None
                else self.latest_restored.to_json(),
            },
            "history": [entry.to_json() for entry in self._history],
        }
