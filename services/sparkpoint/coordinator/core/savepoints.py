"""Every savepoint a job id wrote (Flink lists them in the job's checkpoint history; we keep them
in the job's store record): listed after failover and after the job ended, marked when disposed.
Periodic savepoints (FLIP-10) are bounded in number across the job's runs; manual ones and
stop-with-savepoint ones are never deleted but by a disposal."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sparkpoint.common.events import SavepointFormat, SavepointRecord, SnapshotType
from sparkpoint.coordinator.core.store import CompletedCheckpoint

SAVEPOINTS_KEPT = 1000
"""Savepoints remembered per job id (the newest), for listing and periodic retention."""


class SavepointLedger:
    def __init__(self) -> None:
        self.records: list[SavepointRecord] = []
        """Newest last, at most SAVEPOINTS_KEPT."""

    def restore(self, records: Sequence[SavepointRecord]) -> None:
        self.records = list(records)

    def record(self, savepoint: CompletedCheckpoint, format_type: SavepointFormat) -> None:
        kind = (
            "stop"
            if savepoint.snapshot_type is not SnapshotType.SAVEPOINT
            else "periodic"
            if savepoint.periodic
            else "manual"
        )
        self.records.append(
            SavepointRecord(
                savepoint.checkpoint_id, savepoint.external_path, savepoint.trigger_ms,
                savepoint.completed_ms, savepoint.state_size_bytes, format_type.name, kind,
            )
        )  # fmt: skip
        del self.records[:-SAVEPOINTS_KEPT]

    def beyond_retention(self, retained: int) -> list[str]:
        """The paths of the oldest periodic savepoints not yet disposed beyond the ``retained``
        newest ones."""
        periodic = [s for s in self.records if s.kind == "periodic" and not s.disposed]
        return [s.external_path for s in periodic[: max(0, len(periodic) - retained)]]

    def dispose(self, path: str) -> int:
        """Marks the savepoint at ``path`` disposed; returns its checkpoint id (0 if unknown)."""
        for i, saved in enumerate(self.records):
            if saved.external_path == path and not saved.disposed:
                self.records[i] = dataclasses.replace(saved, disposed=True)
        return next((s.checkpoint_id for s in self.records if s.external_path == path), 0)
