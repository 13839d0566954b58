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
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointStoreRecord,
    DeclineCheckpoint,
    FailoverRequest,
    JobStatus,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SavepointFormat,
    SavepointRecord,
    SnapshotType,
    TriggerCheckpoint,
)
from sparkpoint.common.paths import canonical
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.admission import ack_problem
from sparkpoint.coordinator.core.commands import (
    CancelTimer,
    Command,
    DiscardState,
    FinalizeCheckpoint,
    Publish,
    RequestCompleted,
    RequestFailed,
    ScheduleTimer,
    Timer,
    TimerKind,
)
from sparkpoint.coordinator.core.decider import CheckpointRequest, Decision, RequestDecider
from sparkpoint.coordinator.core.failures import FailoverDecision, FailureManager
from sparkpoint.coordinator.core.pending import AckResult, PendingCheckpoint
from sparkpoint.coordinator.core.scheduler import PeriodicTrigger
from sparkpoint.coordinator.core.stats import CheckpointStatsTracker
from sparkpoint.coordinator.core.store import (
    CheckpointIdCounter,
    CompletedCheckpoint,
    CompletedCheckpointStore,
    Discard,
)

log = logging.getLogger(__name__)

SAVEPOINTS_KEPT = 1000
"""Savepoints remembered per job id (the newest), for listing and periodic retention."""

RECENT_IDS = 16
"""Recently ended checkpoints remembered (with their directories) to recognise late
acknowledgements (Flink keeps 16): their private files are discarded quietly."""

NO_COMMANDS: tuple[Command, ...] = ()

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
        self.decider = RequestDecider(self.config.max_concurrent, self.config.min_pause_ms)
        self.pending: dict[int, PendingCheckpoint] = {}
        self.store = CompletedCheckpointStore(self.config.num_retained)
        self.failures = FailureManager(self.config.tolerable_failed)
        self.stats = CheckpointStatsTracker()
        self.recent: OrderedDict[int, str] = OrderedDict()
        """Recently ended checkpoint id -> its directory, newest last, at most RECENT_IDS."""
        self.last_completed_id: int | None = None
        """The newest checkpoint or savepoint that ever completed for this job id."""
        self.status = JobStatus.RUNNING
        self._subtask_set = frozenset(self.job.subtasks)
        self.job_dir = canonical(f"{self.config.checkpoint_dir}/{self.job.job_id}")
        """The job's own directory under the checkpoint storage."""
        self.last_completion_ms: int | None = None
        self.backlog = False
        self.running = False
        self.periodic = PeriodicTrigger(Timer(self.job.job_id, TimerKind.PERIODIC_CHECKPOINT))
        self.periodic_savepoints = PeriodicTrigger(
            Timer(self.job.job_id, TimerKind.PERIODIC_SAVEPOINT)
        )
        self.savepoints: list[SavepointRecord] = []
        """Every savepoint this job id wrote, newest last (at most SAVEPOINTS_KEPT)."""
        self._canceller_timers: dict[int, Timer] = {}

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self, now_ms: int, next_trigger_ms: int | None = None) -> list[Command]:
        """Starts the periodic triggers; ``next_trigger_ms`` re-arms a stored schedule."""
        self.running = True
        commands: list[Command] = []
        interval = self.config.current_interval_ms(self.backlog)
        if interval is not None:
            commands.append(
                self.periodic.start(
                    interval, now_ms, self.rng, self.config.min_pause_ms, next_trigger_ms
                )
            )
        savepoint_interval = self.config.periodic_savepoint_interval_ms
        if savepoint_interval is not None:
            commands.append(
                self.periodic_savepoints.start(
                    savepoint_interval,
                    now_ms,
                    self.rng,
                    savepoint_interval,
                    now_ms + savepoint_interval,
                )
            )
        return commands

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
        self.store.restore(retained)
        if savepoints:
            self.savepoints = list(savepoints)
        known = [c.checkpoint_id for c in retained]
        if last_completed_id is not None:
            known.append(last_completed_id)
        if self.last_completed_id is not None:
            known.append(self.last_completed_id)
        self.last_completed_id = max(known, default=None)
        latest = self.store.latest()
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
        self.running = False
        commands: list[Command] = []
        for stop in (self.periodic.stop(), self.periodic_savepoints.stop()):
            if stop is not None:
                commands.append(stop)
        for request in self.decider.abort_all():
            self._fail_request(request, reason, "the checkpoint coordinator stopped", commands)
        for pending in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            self._abort(
                pending,
                reason,
                now_ms,
                "the checkpoint coordinator stopped",
                commands,
                choose=False,
            )
        return commands

    def shutdown(self, status: JobStatus, now_ms: int) -> list[Command]:
        """The job ended: stop, then apply externalized-checkpoint retention."""
        commands = self.suspend(now_ms, Reason.CHECKPOINT_COORDINATOR_SHUTDOWN)
        self.status = status
        for discard in self.store.shutdown(status, self.config.externalized_retention):
            commands.append(DiscardState(self.job.job_id, discard))
            self.stats.on_discarded(discard.checkpoint_id)
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
            self._canceller_timers.pop(timer.checkpoint_id, None)
            pending = self.pending.get(timer.checkpoint_id)
            if pending is None or pending.fully_acknowledged or now_ms < pending.deadline_ms:
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
        if timer.kind is TimerKind.PERIODIC_SAVEPOINT and self.periodic_savepoints.armed:
            commands = [self.periodic_savepoints.fired(now_ms)]
            request = CheckpointRequest(SnapshotType.SAVEPOINT, True, now_ms, forced=True)
            commands.extend(self._submit(request, now_ms))
            return commands
        return []

    def _periodic_fire(self, now_ms: int) -> list[Command]:
        if not self.periodic.armed:
            return []
        commands: list[Command] = [self.periodic.fired(now_ms)]
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
        decision = self.decider.submit(request, len(self.pending), self.last_completion_ms, now_ms)
        self._apply(decision, now_ms, commands)
        return commands

    def _choose_queued(self, now_ms: int, commands: list[Command]) -> None:
        if self.running and self.decider.queued:
            decision = self.decider.choose_queued(
                len(self.pending), self.last_completion_ms, now_ms
            )
            self._apply(decision, now_ms, commands)

    def _apply(self, decision: Decision, now_ms: int, commands: list[Command]) -> None:
        for request, reason in decision.dropped:
            self._fail_request(
                request, reason, "request dropped by the checkpoint request decider", commands
            )
        if decision.reschedule_periodic_in_ms is not None and self.periodic.armed:
            commands.append(
                self.periodic.retry_after_pause(now_ms, decision.reschedule_periodic_in_ms)
            )
        if decision.execute is not None:
            self._trigger(decision.execute, now_ms, commands)

    def _trigger(self, request: CheckpointRequest, now_ms: int, commands: list[Command]) -> None:
        checkpoint_id = self.counter.get_and_increment()
        job_id = self.job.job_id
        config = self.config
        if request.is_savepoint:
            directory = request.target_directory or config.savepoint_dir
            name = f"savepoint-{job_id[:6]}-{self.rng.getrandbits(48):012x}"
            location = canonical(f"{directory}/{name}")  # absolute: agents write where it says
        else:
            location = f"{self.job_dir}/chk-{checkpoint_id}"
        unaligned = config.unaligned and not request.is_savepoint
        pending = PendingCheckpoint(
            checkpoint_id,
            request,
            now_ms,
            self.job.subtasks,
            location,
            config.timeout_ms,
            unaligned,
        )
        self.pending[checkpoint_id] = pending
        self.stats.on_triggered(
            checkpoint_id,
            request.snapshot_type,
            now_ms,
            self.job.subtasks,
            pending.acknowledgements,
            unaligned,
        )
        timer = Timer(job_id, TimerKind.CANCELLER, checkpoint_id)
        self._canceller_timers[checkpoint_id] = timer
        aligned_timeout = (
            config.aligned_checkpoint_timeout_ms
            if unaligned and config.aligned_checkpoint_timeout_ms
            else None
        )
        commands.append(ScheduleTimer(timer, pending.deadline_ms))
        commands.append(
            Publish(
                TriggerCheckpoint(
                    job_id,
                    self.owner_epoch,
                    checkpoint_id,
                    now_ms,
                    request.snapshot_type,
                    request.periodic,
                    unaligned,
                    location,
                    aligned_timeout,
                    request.format_type,
                    agent_id=self._agent_id,
                    attempt=self.job.attempt,
                )
            )
        )
        commands.append(
            Publish(self._lifecycle(checkpoint_id, CheckpointEventType.TRIGGERED, request, now_ms))
        )

    # --- acknowledgements and declines --------------------------------------------------------

    def on_acknowledge(
        self, ack: AcknowledgeCheckpoint, now_ms: int
    ) -> tuple[AckResult, Sequence[Command], str | None]:
        """An acknowledgement: (what it did, the commands, why it was refused when it was).

        Only the agent and attempt that drive the job are heard. A late acknowledgement (its
        checkpoint ended) has its private files discarded: those in the checkpoint's own
        directory, and copies in ``shared/`` that nothing references. An acknowledgement for a
        checkpoint this coordinator does not know, or whose files lie anywhere else, is refused
        and deletes nothing: what it names is left for the retention sweep."""
        job = self.job
        if ack.agent_id != self._agent_id or ack.attempt != job.attempt:
            reason = (
                f"from agent {ack.agent_id} attempt {ack.attempt}; the job is driven by "
                f"agent {job.agent_id} attempt {job.attempt}"
            )
            return AckResult.REFUSED, NO_COMMANDS, reason
        pending = self.pending.get(ack.checkpoint_id)
        location = (
            pending.target_location if pending is not None else self.recent.get(ack.checkpoint_id)
        )
        problem = ack_problem(ack, location, self.job_dir, self._subtask_set)
        if problem is not None:
            return AckResult.REFUSED, NO_COMMANDS, problem
        if pending is None:
            return AckResult.DISCARDED, self._discard_late(ack), None
        result = pending.acknowledge(ack)
        if result is AckResult.SUCCESS:
            if ack.state_handles:
                self.store.registry.acquire(h.path for h in ack.state_handles)
            if pending.fully_acknowledged:
                return result, self._fully_acknowledged(pending), None
        return result, NO_COMMANDS, None

    def _discard_late(self, ack: AcknowledgeCheckpoint) -> Sequence[Command]:
        """A late acknowledgement's files that provably belong to it alone: inside its
        checkpoint's directory (already discarded with the checkpoint), or copies in ``shared/``
        that no retained or pending checkpoint references."""
        free = self.store.registry.unreferenced(h.path for h in ack.state_handles)
        if not free:
            return NO_COMMANDS
        discard = Discard(ack.checkpoint_id, tuple(free), None, "late acknowledgement")
        return (DiscardState(self.job.job_id, discard),)

    def _fully_acknowledged(self, pending: PendingCheckpoint) -> list[Command]:
        commands: list[Command] = []
        timer = self._canceller_timers.pop(pending.checkpoint_id, None)
        if timer is not None:
            commands.append(CancelTimer(timer))
        commands.append(
            FinalizeCheckpoint(
                self.job.job_id,
                pending.checkpoint_id,
                pending.request.snapshot_type,
                pending.trigger_ms,
                pending.target_location,
                tuple(pending.acknowledgements.values()),
                pending.request.format_type,
            )
        )
        return commands

    def on_decline(self, decline: DeclineCheckpoint, now_ms: int) -> list[Command]:
        if decline.agent_id != self._agent_id or decline.attempt != self.job.attempt:
            log.info(
                "decline of checkpoint %d of job %s from agent %s attempt %d refused: not the agent that drives the job",
                decline.checkpoint_id, decline.job_id, decline.agent_id, decline.attempt,
            )  # fmt: skip
            return []
        pending = self.pending.get(decline.checkpoint_id)
        if (
            pending is None
            or decline.subtask_id
            not in pending.not_yet_acknowledged | pending.acknowledgements.keys()
        ):
            log.info(
                "decline of checkpoint %d of job %s by %s ignored (not pending or unknown subtask)",
                decline.checkpoint_id,
                decline.job_id,
                decline.subtask_id,
            )
            return []
        commands: list[Command] = []
        message = f"{decline.subtask_id} declined: {decline.message or decline.reason.name}"
        self._abort(pending, decline.reason, now_ms, message, commands)
        return commands

    # --- completion ---------------------------------------------------------------------------------

    def on_finalized(self, checkpoint_id: int, now_ms: int) -> list[Command]:
        """The service wrote ``_metadata``: the checkpoint is complete."""
        pending = self.pending.pop(checkpoint_id, None)
        if pending is None or not pending.fully_acknowledged:
            raise ValueError(
                f"checkpoint {checkpoint_id} of job {self.job.job_id} is not ready to complete"
            )
        pending.dispose()
        self._remember(pending)
        self.last_completed_id = max(checkpoint_id, self.last_completed_id or 0)
        request = pending.request
        acks = pending.acknowledgements.values()
        completed = CompletedCheckpoint(
            checkpoint_id,
            request.snapshot_type,
            request.periodic,
            pending.trigger_ms,
            now_ms,
            pending.target_location,
            sum(a.state_size_bytes for a in acks),
            tuple(h.path for a in acks for h in a.state_handles),
        )
        job_id = self.job.job_id
        commands: list[Command] = []
        # The pending checkpoint's hold on its files passes to the completed one.
        subsumed, discards = self.store.add(completed)
        self.last_completion_ms = now_ms
        self.failures.on_success(checkpoint_id)
        self.stats.on_completed(checkpoint_id, now_ms, pending.target_location)
        commands.append(
            Publish(
                NotifyCheckpointComplete(
                    job_id,
                    self.owner_epoch,
                    checkpoint_id,
                    completed.is_savepoint,
                    completed.external_path,
                    now_ms,
                    agent_id=self._agent_id,
                    attempt=self.job.attempt,
                )
            )
        )
        commands.append(
            Publish(
                self._lifecycle(
                    checkpoint_id,
                    CheckpointEventType.COMPLETED,
                    request,
                    now_ms,
                    external_path=completed.external_path,
                    duration_ms=now_ms - pending.trigger_ms,
                    state_size_bytes=completed.state_size_bytes,
                )
            )
        )
        if request.request_id is not None:
            commands.append(
                RequestCompleted(request.request_id, checkpoint_id, completed.external_path)
            )
        for old in subsumed:
            self.stats.on_discarded(old.checkpoint_id)
            commands.append(
                Publish(
                    CheckpointLifecycleEvent(
                        job_id, self.owner_epoch, old.checkpoint_id, CheckpointEventType.DISCARDED,
                        old.snapshot_type, now_ms, message=f"subsumed by {checkpoint_id}",
                        external_path=old.external_path,
                    )
                )
            )  # fmt: skip
        commands.extend(DiscardState(job_id, d) for d in discards)
        if completed.is_savepoint:
            self._record_savepoint(completed, request, commands)
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

    def _record_savepoint(
        self, savepoint: CompletedCheckpoint, request: CheckpointRequest, commands: list[Command]
    ) -> None:
        """Every savepoint is remembered (listed after failover and after the job ended);
        periodic ones are bounded in number across the job's runs (FLIP-10), manual ones and
        stop-with-savepoint ones are never deleted but by a disposal."""
        kind = (
            "stop"
            if savepoint.snapshot_type is not SnapshotType.SAVEPOINT
            else "periodic"
            if savepoint.periodic
            else "manual"
        )
        self.savepoints.append(
            SavepointRecord(
                savepoint.checkpoint_id, savepoint.external_path, savepoint.trigger_ms,
                savepoint.completed_ms, savepoint.state_size_bytes, request.format_type.name, kind,
            )
        )  # fmt: skip
        del self.savepoints[:-SAVEPOINTS_KEPT]
        periodic = [s for s in self.savepoints if s.kind == "periodic" and not s.disposed]
        for old in periodic[: max(0, len(periodic) - self.config.periodic_savepoint_num_retained)]:
            commands.extend(self.dispose_savepoint(old.external_path, "periodic retention"))

    def dispose_savepoint(self, path: str, reason: str) -> list[Command]:
        """Deletes a savepoint of this job: marked disposed, dropped from the retained
        checkpoints if there, its directory discarded (a savepoint holds only its own files)."""
        commands: list[Command] = []
        for i, saved in enumerate(self.savepoints):
            if saved.external_path == path and not saved.disposed:
                self.savepoints[i] = dataclasses.replace(saved, disposed=True)
        retained = next(
            (c for c in self.store.checkpoints if c.external_path == path and c.is_savepoint),
            None,
        )
        if retained is not None:
            self.store.remove(retained)
            self.stats.on_discarded(retained.checkpoint_id)
        checkpoint_id = next(
            (s.checkpoint_id for s in self.savepoints if s.external_path == path), 0
        )
        commands.append(DiscardState(self.job.job_id, Discard(checkpoint_id, (), path, reason)))
        return commands

    def in_use(self, path: str) -> CompletedCheckpoint | None:
        """The retained checkpoint (not savepoint) at ``path``: the job restores from it."""
        return next(
            (c for c in self.store.checkpoints if c.external_path == path and not c.is_savepoint),
            None,
        )

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
        checkpoint_id = pending.checkpoint_id
        del self.pending[checkpoint_id]
        pending.dispose()
        self._remember(pending)
        job_id = self.job.job_id
        timer = self._canceller_timers.pop(checkpoint_id, None)
        if timer is not None:
            commands.append(CancelTimer(timer))
        free = self.store.registry.release(h.path for h in pending.state_handles())
        directory = pending.target_location
        if free or pending.acknowledgements:
            commands.append(
                DiscardState(job_id, Discard(checkpoint_id, tuple(free), directory, reason.name))
            )
        commands.append(
            Publish(
                NotifyCheckpointAborted(
                    job_id, self.owner_epoch, checkpoint_id, reason, now_ms, message,
                    agent_id=self._agent_id, attempt=self.job.attempt,
                )
            )
        )  # fmt: skip
        event_type = {
            Reason.CHECKPOINT_EXPIRED: CheckpointEventType.EXPIRED,
            Reason.CHECKPOINT_SUBSUMED: CheckpointEventType.SUBSUMED,
        }.get(reason, CheckpointEventType.FAILED)
        commands.append(
            Publish(
                self._lifecycle(
                    checkpoint_id, event_type, pending.request, now_ms, failure_reason=reason,
                    message=message, duration_ms=now_ms - pending.trigger_ms,
                )
            )
        )  # fmt: skip
        self.stats.on_failed(checkpoint_id, now_ms, f"{reason.name}: {message}")
        if pending.request.request_id is not None:
            commands.append(RequestFailed(pending.request.request_id, reason, message))
        decision = self.failures.on_failure(checkpoint_id, reason, pending.is_savepoint)
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
        commands.append(Publish(self._failover(decision, now_ms)))
        self.running = False
        for stop in (self.periodic.stop(), self.periodic_savepoints.stop()):
            if stop is not None:
                commands.append(stop)
        for request in self.decider.abort_all():
            self._fail_request(request, Reason.JOB_FAILOVER_REGION, "the job fails over", commands)
        for pending in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            self._abort(
                pending, Reason.JOB_FAILOVER_REGION, now_ms, "the job fails over", commands,
                choose=False,
            )  # fmt: skip

    def _failover(self, decision: FailoverDecision, now_ms: int) -> FailoverRequest:
        restore = self.store.latest_checkpoint()
        log.warning("job %s must fail over: %s", self.job.job_id, decision.message)
        return FailoverRequest(
            self.job.job_id,
            self.owner_epoch,
            decision.reason,
            decision.message,
            decision.consecutive_failures,
            now_ms,
            failed_checkpoint_id=decision.checkpoint_id,
            restore_checkpoint_id=None if restore is None else restore.checkpoint_id,
            restore_external_path=None if restore is None else restore.external_path,
            agent_id=self._agent_id,
            attempt=self.job.attempt,
        )

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
            subsumed, discards = self.store.set_num_retained(config.num_retained)
            for checkpoint in subsumed:
                self.stats.on_discarded(checkpoint.checkpoint_id)
            commands.extend(DiscardState(self.job.job_id, d) for d in discards)
        self.decider.max_concurrent = config.max_concurrent
        self.decider.min_pause_ms = config.min_pause_ms
        if self.running:
            self._reschedule_periodic(old, now_ms, commands)
            self._reschedule_periodic_savepoints(old, now_ms, commands)
            self._choose_queued(now_ms, commands)
        return commands

    def _apply_timeout(self, timeout_ms: int, now_ms: int, commands: list[Command]) -> None:
        """remaining = new timeout - elapsed: positive reschedules the canceller, zero or
        negative aborts the checkpoint as EXPIRED now."""
        for pending in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            if pending.checkpoint_id not in self.pending or pending.fully_acknowledged:
                continue
            deadline = pending.set_timeout(timeout_ms)
            if deadline > now_ms:
                timer = self._canceller_timers[pending.checkpoint_id]
                commands.append(ScheduleTimer(timer, deadline))
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
        if self.running:
            self._set_periodic_interval(
                old, self.config.current_interval_ms(backlog), now_ms, commands
            )
        return commands

    def _reschedule_periodic(
        self, old: CheckpointConfig, now_ms: int, commands: list[Command]
    ) -> None:
        before = old.current_interval_ms(self.backlog)
        after = self.config.current_interval_ms(self.backlog)
        if before != after:
            self._set_periodic_interval(before, after, now_ms, commands)
        elif old.min_pause_ms != self.config.min_pause_ms and self.periodic.waiting_for_pause:
            assert self.last_completion_ms is not None
            delay = max(0, self.last_completion_ms + self.config.min_pause_ms - now_ms)
            commands.append(self.periodic.retry_after_pause(now_ms, delay))
            if delay == 0:
                commands.extend(self._periodic_fire(now_ms))

    def _set_periodic_interval(
        self, before: int | None, after: int | None, now_ms: int, commands: list[Command]
    ) -> None:
        if after is None:
            stop = self.periodic.stop()
            if stop is not None:
                commands.append(stop)
            return
        if before is None or not self.periodic.armed:
            commands.append(self.periodic.start(after, now_ms, self.rng, self.config.min_pause_ms))
            return
        moved = self.periodic.set_interval(after, now_ms)
        if moved is None:
            return
        commands.append(moved)
        if moved.due_ms <= now_ms:
            commands.extend(self._periodic_fire(now_ms))

    def _reschedule_periodic_savepoints(
        self, old: CheckpointConfig, now_ms: int, commands: list[Command]
    ) -> None:
        before, after = (
            old.periodic_savepoint_interval_ms,
            self.config.periodic_savepoint_interval_ms,
        )
        if before == after:
            return
        if after is None:
            stop = self.periodic_savepoints.stop()
            if stop is not None:
                commands.append(stop)
        elif not self.periodic_savepoints.armed:
            commands.append(
                self.periodic_savepoints.start(after, now_ms, self.rng, after, now_ms + after)
            )
        else:
            moved = self.periodic_savepoints.set_interval(after, now_ms)
            if moved is not None:
                commands.append(moved)

    # --- records ----------------------------------------------------------------------------------------

    def store_record(self, now_ms: int) -> CheckpointStoreRecord:
        return CheckpointStoreRecord(
            self.job.job_id,
            self.owner_epoch,
            self.counter.get(),
            [c.to_record() for c in self.store.checkpoints],
            now_ms,
            agent_id=self.job.agent_id or None,
            attempt=self.job.attempt,
            last_completed_checkpoint_id=self.last_completed_id,
            job_status=self.status.name,
            externalized_retention=self.config.externalized_retention.name,
            savepoints=list(self.savepoints),
        )

    @property
    def _agent_id(self) -> str | None:
        """Control events go to the agent (and attempt) that drives the job."""
        return self.job.agent_id or None

    def _remember(self, pending: PendingCheckpoint) -> None:
        self.recent[pending.checkpoint_id] = pending.target_location
        while len(self.recent) > RECENT_IDS:
            self.recent.popitem(last=False)

    def _lifecycle(
        self,
        checkpoint_id: int,
        event_type: CheckpointEventType,
        request: CheckpointRequest,
        now_ms: int,
        **details: object,
    ) -> CheckpointLifecycleEvent:
        return CheckpointLifecycleEvent(
            self.job.job_id,
            self.owner_epoch,
            checkpoint_id,
            event_type,
            request.snapshot_type,
            now_ms,
            **details,  # type: ignore[arg-type]
        )
