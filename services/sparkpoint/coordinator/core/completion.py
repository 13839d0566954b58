"""What completed for one job and how a checkpoint gets there: the retained checkpoints (the
completed store, which subsumes the oldest beyond ``num-retained``), every savepoint the job
wrote (`SavepointLedger`), the newest id that ever completed and when the last one did.

Completing a fully acknowledged checkpoint (Flink's completePendingCheckpoint, then
addCompletedCheckpointToStoreAndSubsumeOldest and reportCompletedCheckpoint) gives, in order:
NotifyCheckpointComplete, a COMPLETED event, the request's answer, a DISCARDED event per subsumed
checkpoint, the discards retention allows, and for a savepoint the periodic savepoints retention
lets go. What else ends with it (older pending checkpoints, subsumed; the next queued request)
is the coordinator's. The statistics tracker comes with each call: the service may hand a
restarted job's coordinator the tracker of the run before."""

from __future__ import annotations

from collections.abc import Sequence

from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointStoreRecord,
    JobStatus,
    SavepointRecord,
)
from sparkpoint.common.settings import ExternalizedRetention
from sparkpoint.coordinator.core.commands import Command, DiscardState, Publish, RequestCompleted
from sparkpoint.coordinator.core.messages import JobMessages
from sparkpoint.coordinator.core.pending import PendingCheckpoint
from sparkpoint.coordinator.core.savepoints import SavepointLedger
from sparkpoint.coordinator.core.stats import CheckpointStatsTracker
from sparkpoint.coordinator.core.store import (
    CompletedCheckpoint,
    CompletedCheckpointStore,
    Discard,
    DiscardGate,
)


class Completions:
    def __init__(self, messages: JobMessages, num_retained: int, gate: DiscardGate) -> None:
        self.messages = messages
        self.job_id = messages.job_id
        self.gate = gate
        """What subsumption lets go waits for the checkpoints still pending (`DiscardGate`)."""
        self.store = CompletedCheckpointStore(num_retained, gate.registry)
        self.savepoints = SavepointLedger()
        self.last_completed_id: int | None = None
        """The newest checkpoint or savepoint that ever completed for this job id."""
        self.last_completion_ms: int | None = None

    def restore(
        self,
        retained: Sequence[CompletedCheckpoint],
        last_completed_id: int | None,
        savepoints: Sequence[SavepointRecord],
    ) -> CompletedCheckpoint | None:
        """The retained checkpoints as they were stored, the newest id that ever completed and
        every savepoint written; returns the latest retained one."""
        self.store.restore(retained)
        if savepoints:
            self.savepoints.restore(savepoints)
        known = [c.checkpoint_id for c in retained]
        if last_completed_id is not None:
            known.append(last_completed_id)
        if self.last_completed_id is not None:
            known.append(self.last_completed_id)
        self.last_completed_id = max(known, default=None)
        return self.store.latest()

    def add(
        self,
        pending: PendingCheckpoint,
        now_ms: int,
        stats: CheckpointStatsTracker,
        periodic_savepoints_retained: int,
    ) -> tuple[CompletedCheckpoint, list[Command]]:
        """The pending checkpoint's ``_metadata`` is written: it completes."""
        checkpoint_id = pending.checkpoint_id
        self.last_completed_id = max(checkpoint_id, self.last_completed_id or 0)
        request = pending.request
        acks = pending.acknowledgements.values()
        completed = CompletedCheckpoint(
            checkpoint_id, request.snapshot_type, request.periodic, pending.trigger_ms, now_ms,
            pending.target_location, sum(a.state_size_bytes for a in acks),
            tuple(h.path for a in acks for h in a.state_handles),
        )  # fmt: skip
        # The pending checkpoint's hold on its files passes to the completed one.
        subsumed, discards = self.store.add(completed)
        self.last_completion_ms = now_ms
        stats.on_completed(checkpoint_id, now_ms, pending.target_location)
        messages = self.messages
        commands: list[Command] = [
            Publish(messages.complete(completed)),
            Publish(
                messages.lifecycle(
                    checkpoint_id, CheckpointEventType.COMPLETED, request.snapshot_type, now_ms,
                    external_path=completed.external_path,
                    duration_ms=now_ms - pending.trigger_ms,
                    state_size_bytes=completed.state_size_bytes,
                )
            ),
        ]  # fmt: skip
        if request.request_id is not None:
            commands.append(
                RequestCompleted(request.request_id, checkpoint_id, completed.external_path)
            )
        for old in subsumed:
            stats.on_discarded(old.checkpoint_id)
            event = messages.lifecycle(
                old.checkpoint_id, CheckpointEventType.DISCARDED, old.snapshot_type, now_ms,
                message=f"subsumed by {checkpoint_id}", external_path=old.external_path,
            )  # fmt: skip
            commands.append(Publish(event))
        commands.extend(self._let_go(discards))
        if completed.is_savepoint:
            self.savepoints.record(completed, request.format_type)
            for path in self.savepoints.beyond_retention(periodic_savepoints_retained):
                commands.extend(self.dispose_savepoint(path, "periodic retention", stats))
        return completed, commands

    def dispose_savepoint(
        self, path: str, reason: str, stats: CheckpointStatsTracker
    ) -> list[Command]:
        """Deletes a savepoint of this job: marked disposed, dropped from the retained
        checkpoints if there, its directory discarded (a savepoint holds only its own files)."""
        checkpoint_id = self.savepoints.dispose(path)
        retained = next(
            (c for c in self.store.checkpoints if c.external_path == path and c.is_savepoint),
            None,
        )
        if retained is not None:
            self.store.remove(retained)
            stats.on_discarded(retained.checkpoint_id)
        return [DiscardState(self.job_id, Discard(checkpoint_id, (), path, reason))]

    def in_use(self, path: str) -> CompletedCheckpoint | None:
        """The retained checkpoint (not savepoint) at ``path``: the job restores from it."""
        return next(
            (c for c in self.store.checkpoints if c.external_path == path and not c.is_savepoint),
            None,
        )

    def set_num_retained(self, num_retained: int, stats: CheckpointStatsTracker) -> list[Command]:
        subsumed, discards = self.store.set_num_retained(num_retained)
        for checkpoint in subsumed:
            stats.on_discarded(checkpoint.checkpoint_id)
        return self._let_go(discards)

    def _let_go(self, discards: Sequence[Discard]) -> list[Command]:
        """``discards`` as commands: now, or held while other checkpoints are pending; and what
        the gate held that may go now."""
        return [DiscardState(self.job_id, d) for d in self.gate.let_go(discards)]

    def shutdown(
        self, status: JobStatus, retention: ExternalizedRetention, stats: CheckpointStatsTracker
    ) -> list[Command]:
        """The job ended: externalized-checkpoint retention applies."""
        commands: list[Command] = []
        for discard in self.store.shutdown(status, retention):
            commands.append(DiscardState(self.job_id, discard))
            stats.on_discarded(discard.checkpoint_id)
        return commands

    def store_record(
        self, now_ms: int, next_id: int, status: JobStatus, retention: ExternalizedRetention
    ) -> CheckpointStoreRecord:
        """The job's record in the checkpoint store, with ``next_id`` as the id counter."""
        messages = self.messages
        return CheckpointStoreRecord(
            self.job_id,
            messages.owner_epoch,
            next_id,
            [c.to_record() for c in self.store.checkpoints],
            now_ms,
            agent_id=messages.agent_id,
            attempt=messages.attempt,
            last_completed_checkpoint_id=self.last_completed_id,
            job_status=status.name,
            externalized_retention=retention.name,
            savepoints=list(self.savepoints.records),
        )
