"""The checkpoint coordinator of one job (Flink's CheckpointCoordinator), as pure logic.

Inputs come with the time they happen (``now_ms``): timers firing, acknowledgements, declines,
manual requests, configuration changes, backlog reports, the service's report that ``_metadata``
was written. Each input returns the commands to carry out (`sparkpoint.coordinator.core.commands`):
publish an event, schedule or cancel a timer, finalize a checkpoint, discard state, answer a
request. No I/O, no wall clock, no threads; randomness is injected.

A checkpoint's life:

1. A request (periodic timer, manual, savepoint) goes through the `RequestDecider`.
2. Triggered: it gets the next id from the counter, a pending checkpoint expecting every subtask,
   a canceller timer at ``trigger + timeout``; TriggerCheckpoint and a TRIGGERED lifecycle event
   are published.
3. Every subtask acknowledged: the canceller is cancelled and FinalizeCheckpoint asks the service
   to write ``_metadata``. ``on_finalized`` then adds it to the completed store (subsuming the
   oldest beyond ``num-retained``), aborts older pending checkpoints as SUBSUMED (not for
   savepoints), and publishes NotifyCheckpointComplete, a COMPLETED event and the store record.
4. Aborted (expired, declined, subsumed, shut down): NotifyCheckpointAborted, a lifecycle event,
   its state discarded unless something else references it, the failure counted by the
   `FailureManager`, which may ask for a failover.

The class decides (what to trigger and when, what an abort entails, what a configuration change
moves); the state lives in parts it owns, each in its module: `InFlight` (the pending checkpoints,
their cancellers, the ids ended lately; it answers acknowledgements), `Completions` (the completed
store, the savepoints, completion and subsumption), `PeriodicSchedules` (the periodic triggers),
`JobMessages` (every event it publishes), and the decider, failure manager and statistics.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointStoreRecord,
    DeclineCheckpoint,
    JobStatus,
    SavepointFormat,
    SavepointRecord,
    SnapshotType,
)
from sparkpoint.common.paths import canonical
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.commands import (
    Command,
    Publish,
    RequestFailed,
    Timer,
    TimerKind,
)
from sparkpoint.coordinator.core.completion import Completions
from sparkpoint.coordinator.core.decider import CheckpointRequest, Decision, RequestDecider
from sparkpoint.coordinator.core.failures import FailoverDecision, FailureManager
from sparkpoint.coordinator.core.in_flight import InFlight
from sparkpoint.coordinator.core.messages import JobMessages
from sparkpoint.coordinator.core.pending import AckResult, PendingCheckpoint
from sparkpoint.coordinator.core.schedules import PeriodicSchedules
from sparkpoint.coordinator.core.stats import CheckpointStatsTracker
from sparkpoint.coordinator.core.store import (
    CheckpointIdCounter,
    CompletedCheckpoint,
    CompletedCheckpointStore,
    FileRegistry,
)

log = logging.getLogger(__name__)

Reason = CheckpointFailureReason


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    subtasks: tuple[str, ...]
    agent_id: str = ""
    """The agent that drives the job: control events are addressed to it, and only its answers
    count."""
    attempt: int = 0

    def __post_init__(self) -> None:
        if not self.subtasks:
            raise ValueError(f"job {self.job_id} has no subtasks")


@dataclass
class CheckpointCoordinator:
    job: JobInfo
    config: CheckpointConfig
    counter: CheckpointIdCounter
    rng: random.Random = field(default_factory=random.Random)
    owner_epoch: int = 0

    def __post_init__(self) -> None:
        self.config.validate()
        job = self.job
        self.decider = RequestDecider(self.config.max_concurrent, self.config.min_pause_ms)
        self.failures = FailureManager(self.config.tolerable_failed)
        self.stats = CheckpointStatsTracker()
        self.status = JobStatus.RUNNING
        self.job_dir = canonical(f"{self.config.checkpoint_dir}/{job.job_id}")
        """The job's own directory under the checkpoint storage."""
        self.backlog = False
        self.running = False
        self.messages = JobMessages(job.job_id, self.owner_epoch, job.agent_id or None, job.attempt)
        self.schedules = PeriodicSchedules(job.job_id, self.rng)
        registry = FileRegistry()
        self.in_flight = InFlight(self.messages, job.agent_id, job.subtasks, self.job_dir, registry)
        self.completions = Completions(self.messages, self.config.num_retained, self.in_flight.gate)

    @property
    def pending(self) -> dict[int, PendingCheckpoint]:
        """The checkpoints triggered and not ended yet, by id."""
        return self.in_flight.pending

    @property
    def store(self) -> CompletedCheckpointStore:
        return self.completions.store

    @property
    def savepoints(self) -> list[SavepointRecord]:
        """Every savepoint this job id wrote, newest last (at most SAVEPOINTS_KEPT)."""
        return self.completions.savepoints.records

    @property
    def last_completed_id(self) -> int | None:
        """The newest checkpoint or savepoint that ever completed for this job id."""
        return self.completions.last_completed_id

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self, now_ms: int, next_trigger_ms: int | None = None) -> list[Command]:
        """Starts the periodic triggers; ``next_trigger_ms`` re-arms a stored schedule."""
        self.running = True
        config = self.config
        return self.schedules.start(
            config.current_interval_ms(self.backlog), config.min_pause_ms,
            config.periodic_savepoint_interval_ms, now_ms, next_trigger_ms,
        )  # fmt: skip

    def restore(
        self,
        retained: Sequence[CompletedCheckpoint],
        restored_ms: int | None = None,
        last_completed_id: int | None = None,
        savepoints: Sequence[SavepointRecord] = (),
    ) -> None:
        """Failover or restart: the retained checkpoints as they were stored, the newest id that
        ever completed and every savepoint written. With ``restored_ms``, the latest one is
        reported as restored in the statistics."""
        latest = self.completions.restore(retained, last_completed_id, savepoints)
        if latest is not None:
            self.counter.set_count(latest.checkpoint_id + 1)
            self.failures.on_success(latest.checkpoint_id)
            if restored_ms is not None:
                self.stats.on_restored(
                    latest.checkpoint_id, restored_ms, latest.is_savepoint, latest.external_path
                )

    def suspend(
        self, now_ms: int, reason: Reason = Reason.CHECKPOINT_COORDINATOR_SUSPEND
    ) -> list[Command]:
        """Stops triggering and aborts everything in flight (job restarting, ownership lost)."""
        commands: list[Command] = []
        self._stop(reason, "the checkpoint coordinator stopped", now_ms, commands)
        return commands

    def shutdown(self, status: JobStatus, now_ms: int) -> list[Command]:
        """The job ended: stop, then apply externalized-checkpoint retention."""
        commands = self.suspend(now_ms, Reason.CHECKPOINT_COORDINATOR_SHUTDOWN)
        self.status = status
        retention = self.config.externalized_retention
        commands.extend(self.completions.shutdown(status, retention, self.stats))
        self.counter.shutdown(status)
        return commands

    # --- requests ---------------------------------------------------------------------------------

    def trigger_checkpoint(
        self, now_ms: int, request_id: str | None = None, full: bool = False, forced: bool = False
    ) -> list[Command]:
        """A manual checkpoint (``POST /jobs/:id/checkpoints``)."""
        snapshot_type = SnapshotType.FULL_CHECKPOINT if full else SnapshotType.CHECKPOINT
        request = CheckpointRequest(snapshot_type, False, now_ms, request_id, forced)
        return self._submit(request, now_ms)

    def trigger_savepoint(
        self,
        now_ms: int,
        request_id: str | None = None,
        target_directory: str | None = None,
        terminate: bool = False,
        format_type: SavepointFormat = SavepointFormat.CANONICAL,
        drain: bool = False,
    ) -> list[Command]:
        """A manual savepoint; ``terminate`` for stop-with-savepoint, which ``drain`` makes
        Flink's SAVEPOINT_TERMINATE (the input ends and is processed first), else
        SAVEPOINT_SUSPEND."""
        snapshot_type = SnapshotType.SAVEPOINT
        if terminate:
            snapshot_type = (
                SnapshotType.SAVEPOINT_TERMINATE if drain else SnapshotType.SAVEPOINT_SUSPEND
            )
        request = CheckpointRequest(
            snapshot_type, False, now_ms, request_id, True, target_directory, format_type
        )
        return self._submit(request, now_ms)

    def on_timer(self, timer: Timer, now_ms: int) -> list[Command]:
        if timer.kind is TimerKind.CANCELLER:
            pending = self.in_flight.expired(timer, now_ms)
            if pending is None:
                return []
            commands: list[Command] = []
            self._abort(
                pending, Reason.CHECKPOINT_EXPIRED, now_ms, "expired before completing", commands
            )
            return commands
        if not self.running:
            return []
        if timer.kind is TimerKind.PERIODIC_CHECKPOINT:
            return self._periodic_fire(now_ms)
        if timer.kind is TimerKind.PERIODIC_SAVEPOINT and self.schedules.savepoints.armed:
            commands = [self.schedules.savepoints.fired(now_ms)]
            request = CheckpointRequest(SnapshotType.SAVEPOINT, True, now_ms, forced=True)
            commands.extend(self._submit(request, now_ms))
            return commands
        return []

    def _periodic_fire(self, now_ms: int) -> list[Command]:
        periodic = self.schedules.checkpoints
        if not periodic.armed:
            return []
        commands: list[Command] = [periodic.fired(now_ms)]
        commands.extend(
            self._submit(CheckpointRequest(SnapshotType.CHECKPOINT, True, now_ms), now_ms)
        )
        return commands

    def _submit(self, request: CheckpointRequest, now_ms: int) -> list[Command]:
        commands: list[Command] = []
        if not self.running:
            self._fail_request(
                request, Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, "the job is not running", commands
            )
            return commands
        last = self.completions.last_completion_ms
        decision = self.decider.submit(request, len(self.pending), last, now_ms)
        self._apply(decision, now_ms, commands)
        return commands

    def _choose_queued(self, now_ms: int, commands: list[Command]) -> None:
        if self.running and self.decider.queued:
            last = self.completions.last_completion_ms
            decision = self.decider.choose_queued(len(self.pending), last, now_ms)
            self._apply(decision, now_ms, commands)

    def _apply(self, decision: Decision, now_ms: int, commands: list[Command]) -> None:
        for request, reason in decision.dropped:
            self._fail_request(
                request, reason, "request dropped by the checkpoint request decider", commands
            )
        periodic = self.schedules.checkpoints
        if decision.reschedule_periodic_in_ms is not None and periodic.armed:
            commands.append(periodic.retry_after_pause(now_ms, decision.reschedule_periodic_in_ms))
        if decision.execute is not None:
            self._trigger(decision.execute, now_ms, commands)

    def _trigger(self, request: CheckpointRequest, now_ms: int, commands: list[Command]) -> None:
        checkpoint_id = self.counter.get_and_increment()
        if request.is_savepoint:
            directory = request.target_directory or self.config.savepoint_dir
            name = f"savepoint-{self.job.job_id[:6]}-{self.rng.getrandbits(48):012x}"
            location = canonical(f"{directory}/{name}")  # absolute: agents write where it says
        else:
            location = f"{self.job_dir}/chk-{checkpoint_id}"
        commands.extend(
            self.in_flight.trigger(
                checkpoint_id, request, now_ms, location, self.config, self.stats
            )
        )

    # --- acknowledgements, declines, completion ---------------------------------------------------

    def on_acknowledge(
        self, ack: AcknowledgeCheckpoint, now_ms: int
    ) -> tuple[AckResult, Sequence[Command], str | None]:
        """An acknowledgement: (what it did, the commands, why it was refused when it was); see
        `InFlight.acknowledge`."""
        return self.in_flight.acknowledge(ack)

    def on_decline(self, decline: DeclineCheckpoint, now_ms: int) -> list[Command]:
        pending = self.in_flight.declined(decline)
        if pending is None:
            return []
        commands: list[Command] = []
        message = f"{decline.subtask_id} declined: {decline.message or decline.reason.name}"
        self._abort(pending, decline.reason, now_ms, message, commands)
        return commands

    def on_finalized(self, checkpoint_id: int, now_ms: int) -> list[Command]:
        """The service wrote ``_metadata``: the checkpoint is complete; older pending checkpoints
        are subsumed by it (not by a savepoint), and the next queued request may go."""
        pending = self.in_flight.finish(checkpoint_id)
        self.failures.on_success(checkpoint_id)
        retained = self.config.periodic_savepoint_num_retained
        completed, commands = self.completions.add(pending, now_ms, self.stats, retained)
        commands.append(Publish(self.store_record(now_ms)))
        if not completed.is_savepoint:
            for older in sorted(p for p in self.pending if p < checkpoint_id):
                if not self.pending[older].is_savepoint:
                    self._abort(
                        self.pending[older], Reason.CHECKPOINT_SUBSUMED, now_ms,
                        f"subsumed by checkpoint {checkpoint_id}", commands, choose=False,
                    )  # fmt: skip
        self._choose_queued(now_ms, commands)
        return commands

    def on_finalize_failed(self, checkpoint_id: int, now_ms: int, message: str) -> list[Command]:
        """Writing ``_metadata`` failed: the checkpoint fails (counted, as Flink counts it)."""
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return []
        commands: list[Command] = []
        self._abort(pending, Reason.FINALIZE_CHECKPOINT_FAILURE, now_ms, message, commands)
        return commands

    def dispose_savepoint(self, path: str, reason: str) -> list[Command]:
        """Deletes a savepoint of this job (see `Completions.dispose_savepoint`)."""
        return self.completions.dispose_savepoint(path, reason, self.stats)

    def in_use(self, path: str) -> CompletedCheckpoint | None:
        """The retained checkpoint (not savepoint) at ``path``: the job restores from it."""
        return self.completions.in_use(path)

    # --- abort ----------------------------------------------------------------------------------------

    def _abort(
        self,
        pending: PendingCheckpoint,
        reason: Reason,
        now_ms: int,
        message: str,
        commands: list[Command],
        choose: bool = True,
    ) -> None:
        commands.extend(self.in_flight.abort(pending, reason, now_ms, message, self.stats))
        decision = self.failures.on_failure(pending.checkpoint_id, reason, pending.is_savepoint)
        if decision is not None:
            self._fail_over(decision, now_ms, commands)
        if choose:
            self._choose_queued(now_ms, commands)

    def _fail_request(
        self, request: CheckpointRequest, reason: Reason, message: str, commands: list[Command]
    ) -> None:
        if request.request_id is not None:
            commands.append(RequestFailed(request.request_id, reason, message))
        elif not request.periodic:
            log.info("checkpoint request of job %s dropped: %s", self.job.job_id, reason.name)

    def _fail_over(self, decision: FailoverDecision, now_ms: int, commands: list[Command]) -> None:
        """The job restarts from its latest checkpoint; until its agent registers the next
        attempt, nothing more is triggered and nothing in flight completes (as Flink aborts
        pending checkpoints on a failover), so the checkpoint the request names stays the
        latest and keeps its files."""
        log.warning("job %s must fail over: %s", self.job.job_id, decision.message)
        restore = self.store.latest_checkpoint()
        commands.append(Publish(self.messages.failover(decision, restore, now_ms)))
        self._stop(Reason.JOB_FAILOVER_REGION, "the job fails over", now_ms, commands)

    def _stop(self, reason: Reason, message: str, now_ms: int, commands: list[Command]) -> None:
        """No more triggers: the periodic ones stop, queued requests fail, pending checkpoints
        are aborted (oldest first)."""
        self.running = False
        commands.extend(self.schedules.stop())
        for request in self.decider.abort_all():
            self._fail_request(request, reason, message, commands)
        for pending in self.in_flight.oldest_first():
            self._abort(pending, reason, now_ms, message, commands, choose=False)

    # --- runtime configuration (FLIP-571 and beyond) ------------------------------------------------

    def apply_config(self, config: CheckpointConfig, now_ms: int) -> list[Command]:
        """Applies a new effective configuration to a running job, as Flink would have applied
        it had it been configured from the start."""
        config.validate()
        old, self.config = self.config, config
        commands: list[Command] = []
        if config.timeout_ms != old.timeout_ms:
            self._apply_timeout(config.timeout_ms, now_ms, commands)
        if config.tolerable_failed != old.tolerable_failed:
            decision = self.failures.set_tolerable(config.tolerable_failed)
            if decision is not None:
                self._fail_over(decision, now_ms, commands)
        if config.num_retained != old.num_retained:
            commands.extend(self.completions.set_num_retained(config.num_retained, self.stats))
        self.decider.max_concurrent = config.max_concurrent
        self.decider.min_pause_ms = config.min_pause_ms
        if self.running:
            self._reschedule_periodic(old, now_ms, commands)
            commands.extend(
                self.schedules.move_savepoints(
                    old.periodic_savepoint_interval_ms,
                    config.periodic_savepoint_interval_ms,
                    now_ms,
                )
            )
            self._choose_queued(now_ms, commands)
        return commands

    def _apply_timeout(self, timeout_ms: int, now_ms: int, commands: list[Command]) -> None:
        """remaining = new timeout - elapsed: positive reschedules the canceller, zero or
        negative aborts the checkpoint as EXPIRED now."""
        for pending, canceller in self.in_flight.set_timeout(timeout_ms, now_ms):
            if canceller is not None:
                commands.append(canceller)
            else:
                message = f"the new timeout of {timeout_ms} ms has already passed"
                self._abort(
                    pending, Reason.CHECKPOINT_EXPIRED, now_ms, message, commands, choose=False
                )

    def set_backlog(self, backlog: bool, now_ms: int) -> list[Command]:
        """Sources report (or stop reporting) backlog (FLIP-309): the interval in force changes."""
        if backlog == self.backlog:
            return []
        old = self.config.current_interval_ms(self.backlog)
        self.backlog = backlog
        commands: list[Command] = []
        new = self.config.current_interval_ms(backlog)
        if self.running and new != old:  # no interval during backlog set: nothing moves
            moved = self.schedules.move_checkpoints(old, new, now_ms, self.config.min_pause_ms)
            self._moved(moved, now_ms, commands)
        return commands

    def _reschedule_periodic(
        self, old: CheckpointConfig, now_ms: int, commands: list[Command]
    ) -> None:
        before = old.current_interval_ms(self.backlog)
        after = self.config.current_interval_ms(self.backlog)
        pause = self.config.min_pause_ms
        if before != after:
            self._moved(
                self.schedules.move_checkpoints(before, after, now_ms, pause), now_ms, commands
            )
        elif old.min_pause_ms != pause:
            last = self.completions.last_completion_ms
            self._moved(self.schedules.move_pause(last, pause, now_ms), now_ms, commands)

    def _moved(
        self, moved: tuple[list[Command], bool], now_ms: int, commands: list[Command]
    ) -> None:
        """The periodic checkpoint trigger moved; moved to now or earlier, it fires at once."""
        schedule, due = moved
        commands.extend(schedule)
        if due:
            commands.extend(self._periodic_fire(now_ms))

    # --- records ----------------------------------------------------------------------------------------

    def store_record(self, now_ms: int) -> CheckpointStoreRecord:
        retention = self.config.externalized_retention
        return self.completions.store_record(now_ms, self.counter.get(), self.status, retention)
