"""A fresh checkpoint coordinator for an accepted registration: a new job, a restart (the job's
next attempt: same stores, same statistics and history), a takeover of a job whose agent died,
or a job taken over with its partition.

Its configuration is the job's options over this instance's defaults, with the job's overrides
(FLIP-571) on top; its next checkpoint id lies above every id the job ever used; its retained
checkpoints and savepoints are restored from what this instance knows or else from the store
record; a snapshot restored in CLAIM mode becomes one of its checkpoints. Reads of checkpoint
storage (a claimed snapshot's ``_metadata``, the job's ``chk-<id>`` directories) go through
`SnapshotStorage`; nothing is published or registered here (`registry.JobRegistry` does that)."""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Protocol

from sparkpoint.common.clock import Clock
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointStoreRecord,
    Event,
    JobRegistered,
    JobStatus,
    NotifyCheckpointAborted,
    SnapshotType,
)
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.common.settings import CheckpointConfig, ConfigError, RecoveryConfig
from sparkpoint.common.storage import CHECKPOINT_DIR, PathOutsideRoots
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.core.store import CompletedCheckpoint
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter
from sparkpoint.coordinator.service.owned import JobHistory, OwnedJob

log = logging.getLogger(__name__)

LEFT_PENDING_WINDOW = 16
"""How many of the newest ids a new owner declares aborted (see `JobStarter._left_pending`)."""


class SnapshotStorage(Protocol):
    """What starting a job reads from checkpoint storage (`Storage` is one)."""

    def read(self, path: str) -> bytes: ...
    def list_dirs(self, path: str) -> list[str]: ...


@dataclass(frozen=True)
class Started:
    job: OwnedJob
    left_pending: list[Event]
    """Abort notices for the checkpoints a previous owner may have left pending."""
    now_ms: int
    """When it started (its history and its agent's last word say so)."""


class JobStarter:
    def __init__(self, defaults: CheckpointConfig, storage: SnapshotStorage, clock: Clock) -> None:
        self.defaults, self.storage, self.clock = defaults, storage, clock

    def start(
        self,
        registration: JobRegistered,
        partition: int,
        epoch: int,
        adopted: bool,
        known: tuple[OwnedJob | None, OwnedJob | None],
        durable: CheckpointStoreRecord | None,
        replayed: CheckpointOverrides | None,
    ) -> Started | None:
        """``known``: the job's coordinator running here until now (a restart) and the one
        that ended here, if any; ``durable``, its store record; ``replayed``, the overrides the
        replay found. None when its configuration is invalid with this instance's defaults."""
        previous, ended = known
        configured = self._configuration(registration, previous, replayed)
        if configured is None:
            return None
        base, config, overrides = configured
        subtasks = tuple(s.subtask_id for s in registration.subtasks)
        core = CheckpointCoordinator(
            JobInfo(registration.job_id, subtasks, registration.agent_id, registration.attempt),
            config,
            InMemoryCheckpointIdCounter(),
            owner_epoch=epoch,
        )
        if previous is not None:  # a restart: the job's statistics go on
            core.stats = previous.core.stats
        now = self.clock.now_ms()
        core.counter.set_count(self._next_id(registration, config, durable, previous, ended))
        left_pending = self._restore(core, adopted, previous, durable, now)
        if previous is None and registration.restored_external_path is not None:
            self._claim(core, registration)
        if registration.restored_checkpoint_id is not None:
            core.stats.on_restored(
                registration.restored_checkpoint_id,
                registration.timestamp,
                False,
                registration.restored_external_path or "",
            )
        history = (
            previous.history if previous else JobHistory(started_ms=registration.timestamp or now)
        )
        history.record(JobStatus.RUNNING, now)
        job = OwnedJob(
            registration, partition, base, core, overrides, last_seen_ms=now, history=history
        )
        return Started(job, left_pending, now)

    def _configuration(
        self,
        registration: JobRegistered,
        previous: OwnedJob | None,
        replayed: CheckpointOverrides | None,
    ) -> tuple[CheckpointConfig, CheckpointConfig, CheckpointOverrides | None] | None:
        """(the job's options over the defaults, that with its overrides, the overrides)."""
        job_id = registration.job_id
        try:
            base = CheckpointConfig.from_options(registration.configuration, self.defaults)
        except ConfigError as exc:  # the defaults and the job's options together are invalid
            log.error(
                "job %s: its configuration is invalid with this coordinator's defaults: %s",
                job_id,
                exc,
            )
            return None
        overrides = previous.overrides if previous is not None else replayed
        config = base
        if overrides is not None:
            try:
                config = base.with_overrides(overrides.overrides)
            except ConfigError as exc:
                log.error(
                    "job %s: stored overrides no longer apply (%s); using its configuration",
                    job_id,
                    exc,
                )
        return base, config, overrides

    def _restore(
        self,
        core: CheckpointCoordinator,
        adopted: bool,
        previous: OwnedJob | None,
        durable: CheckpointStoreRecord | None,
        now: int,
    ) -> list[Event]:
        """The retained checkpoints and savepoints: what this instance knows is newer than any
        store record. Returns the abort notices a takeover of a running job owes its agent."""
        if previous is not None:
            core.restore(
                previous.core.store.checkpoints,
                last_completed_id=previous.core.last_completed_id,
                savepoints=previous.core.savepoints,
            )
        elif durable is not None:
            core.restore(
                [CompletedCheckpoint.from_record(r) for r in durable.retained],
                last_completed_id=durable.last_completed_checkpoint_id,
                savepoints=durable.savepoints,
            )
            if adopted and durable.job_status in (None, JobStatus.RUNNING.name):
                return self._left_pending(core.job.job_id, durable, core.owner_epoch, now)
        return []

    def _claim(self, core: CheckpointCoordinator, registration: JobRegistered) -> None:
        """CLAIM mode (``execution.state-recovery.claim-mode``): the snapshot the job restored
        becomes a retained checkpoint of the job, which retention subsumes and deletes like any
        other. NO_CLAIM (the default): never touched (the agent's first checkpoint is full)."""
        path = registration.restored_external_path
        if (
            path is None
            or RecoveryConfig.from_options(registration.configuration).claim_mode != "CLAIM"
        ):
            return
        held = next((c for c in core.store.checkpoints if c.external_path == path), None)
        if held is not None and not held.is_savepoint:
            return  # already a checkpoint of the job's own
        if held is not None:  # a savepoint it keeps: from now on a checkpoint retention deletes
            core.store.remove(held)  # (its files are claimed below, not discarded)
        try:
            data = self.storage.read(f"{path}/_metadata")
            metadata = SnapshotMetadata.from_json(data, path)
        except (OSError, BadMetadata, PathOutsideRoots) as exc:
            log.error("job %s: cannot claim %s: %s", registration.job_id, path, exc)
            return
        now = self.clock.now_ms()
        claimed = CompletedCheckpoint(
            metadata.checkpoint_id, SnapshotType.CHECKPOINT, False, metadata.trigger_ms, now,
            path, metadata.state_size, tuple(metadata.files()),
        )  # fmt: skip
        core.restore([claimed])
        log.info(
            "job %s claimed %s (checkpoint %d)", registration.job_id, path, claimed.checkpoint_id
        )

    def _next_id(
        self,
        registration: JobRegistered,
        config: CheckpointConfig,
        durable: CheckpointStoreRecord | None,
        previous: OwnedJob | None,
        ended: OwnedJob | None,
    ) -> int:
        """The job's next checkpoint id: above every id it ever used. The durable store record
        (updated with every record this instance writes), the coordinators of its earlier
        runs here, the checkpoint it restored, and, when no store record exists (a new job, or a
        broker that lost its topics), the checkpoint directories on storage."""
        candidates = [1]
        if durable is not None:
            candidates.append(durable.checkpoint_id_counter)
        for earlier in (previous, ended):
            if earlier is not None:
                candidates.append(earlier.core.counter.get())
        if registration.restored_checkpoint_id is not None:
            candidates.append(registration.restored_checkpoint_id + 1)
        if durable is None:
            candidates.append(
                self._directories_floor(
                    f"{config.checkpoint_dir.rstrip('/')}/{registration.job_id}"
                )
            )
        return max(candidates)

    def _directories_floor(self, job_dir: str) -> int:
        """One above the highest ``chk-<id>`` directory under ``job_dir`` (1 when none)."""
        try:
            names = [posixpath.basename(d.rstrip("/")) for d in self.storage.list_dirs(job_dir)]
        except Exception as exc:  # storage trouble must not block a registration
            log.warning("listing %s for used checkpoint ids failed: %s", job_dir, exc)
            return 1
        ids = [int(m.group(1)) for n in names if (m := CHECKPOINT_DIR.match(n))]
        return max(ids, default=0) + 1

    @staticmethod
    def _left_pending(
        job_id: str, store: CheckpointStoreRecord, epoch: int, now: int
    ) -> list[Event]:
        """The job moved here: checkpoints the previous owner triggered after its last retained
        one may still be pending with the agents. They will never complete; say so, as Flink
        aborts pending checkpoints on JobManager failover. The newest few ids are enough: at
        most max-concurrent checkpoints are ever pending."""
        last = max((r.checkpoint_id for r in store.retained), default=0)
        first = max(last + 1, store.checkpoint_id_counter - LEFT_PENDING_WINDOW)
        reason = CheckpointFailureReason.CHECKPOINT_COORDINATOR_SUSPEND
        message = "the coordinator of this job changed"
        events: list[Event] = []
        for checkpoint_id in range(first, store.checkpoint_id_counter):
            events.append(
                NotifyCheckpointAborted(
                    job_id, epoch, checkpoint_id, reason, now, message,
                    agent_id=store.agent_id, attempt=store.attempt,
                )
            )  # fmt: skip
            events.append(
                CheckpointLifecycleEvent(
                    job_id, epoch, checkpoint_id, CheckpointEventType.FAILED, SnapshotType.CHECKPOINT,
                    now, failure_reason=reason, message=message,
                )
            )  # fmt: skip
        return events
