"""The checkpoint pipeline of the service, Flink's receiveAcknowledgeMessage ->
completePendingCheckpoint -> sendAcknowledgeMessages on our terms:

1. the acknowledgement reader hands a batch of answers to the loop (`CheckpointPipeline.on_acks`):
   each must come from the agent that holds its job (else it is refused and counted); a
   heartbeat renews the agent's lease, an acknowledgement or a decline goes to the job's core;
2. the core returns commands, which `CommandExecutor` carries out, one handler per command type:
   events are published in one transaction on the job's partition (a trigger with the job's
   store record, so its id is durable first), timers scheduled or cancelled, state discarded,
   REST requests answered;
3. a FinalizeCheckpoint goes to the file threads (`_metadata`, written atomically);
4. once written, back on the loop, the core completes the checkpoint (or fails it), and its
   commands (NotifyCheckpointComplete, the lifecycle event, the store record) go through step 2.

The same executor carries out what the timers (`Timers`), the job registry and the REST
operations get from a core. A trace (`trace.StepTrace`, installed by the latency benchmark)
marks each step."""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkpoint.common.clock import Clock
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    AgentHeartbeat,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import Received
from sparkpoint.common.metadata import SnapshotMetadata
from sparkpoint.coordinator.core.admission import sender_problem
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
)
from sparkpoint.coordinator.core.pending import AckResult
from sparkpoint.coordinator.service.files import Delete, Write
from sparkpoint.coordinator.service.owned import OwnedJob
from sparkpoint.coordinator.service.publisher import Publisher
from sparkpoint.coordinator.service.rejections import Rejections, skip_unexpected
from sparkpoint.coordinator.service.timers import Timers
from sparkpoint.coordinator.service.trace import StepTrace
from sparkpoint.coordinator.service.writer import Done

log = logging.getLogger(__name__)


class MetadataFiles(Protocol):
    """The file threads (`files.FileWork` is one)."""

    def write(self, work: Write) -> None: ...
    def delete(self, work: Delete) -> None: ...


@dataclass
class _Batch:
    """What one call to `CommandExecutor.execute` gathers: the events for one transaction, and
    whether a timer was scheduled (the timer task is woken once)."""

    events: list[Event] = field(default_factory=list)
    rearm: bool = False


class CommandExecutor:
    def __init__(
        self,
        publisher: Publisher,
        timers: Timers,
        files: MetadataFiles,
        clock: Clock,
        answer: Callable[[RequestCompleted | RequestFailed], None],
    ) -> None:
        """``answer`` tells a REST request how it ended. ``finalize`` (for FinalizeCheckpoint)
        is the pipeline's, set when the pipeline is built."""
        self.publisher, self.timers, self.files, self.clock = publisher, timers, files, clock
        self.answer = answer
        self.finalize: Callable[[OwnedJob, FinalizeCheckpoint], None] = _no_finalize
        self.trace: StepTrace | None = None
        self._handlers: dict[type, Callable[[OwnedJob, Any, _Batch], None]] = {
            Publish: self._publish,
            ScheduleTimer: self._schedule,
            CancelTimer: self._cancel,
            FinalizeCheckpoint: lambda job, command, _: self.finalize(job, command),
            DiscardState: lambda job, command, _: self._discard(command),
            RequestCompleted: lambda job, command, _: self.answer(command),
            RequestFailed: lambda job, command, _: self.answer(command),
        }
        assert set(self._handlers) == set(typing.get_args(Command)), "a command without handler"

    def execute(self, job: OwnedJob, commands: Sequence[Command]) -> None:
        if not commands:
            return
        batch = _Batch()
        handlers = self._handlers
        for command in commands:
            handlers[type(command)](job, command, batch)
        if batch.rearm:
            self.timers.wake()
        if batch.events:
            events = batch.events
            self.publisher.publish(
                job, events, None if self.trace is None else self._traced(events)
            )

    def _publish(self, job: OwnedJob, command: Publish, batch: _Batch) -> None:
        event = command.event
        if isinstance(event, TriggerCheckpoint):
            batch.events.append(job.core.store_record(self.clock.now_ms()))  # the id counter first
        batch.events.append(event)
        if isinstance(event, FailoverRequest):
            job.last_failover = event

    def _schedule(self, job: OwnedJob, command: ScheduleTimer, batch: _Batch) -> None:
        self.timers.schedule(command.timer, command.due_ms)
        batch.rearm = True

    def _cancel(self, job: OwnedJob, command: CancelTimer, batch: _Batch) -> None:
        self.timers.cancel(command.timer)

    def _discard(self, command: DiscardState) -> None:
        def failed(exc: Exception) -> None:  # a failed discard leaves garbage, never breaks the job
            log.warning(
                "job %s: discarding checkpoint %d state failed: %s",
                command.job_id,
                command.discard.checkpoint_id,
                exc,
            )

        self.files.delete(Delete(command.discard.files, command.discard.directory, failed))

    def _traced(self, events: Sequence[Event]) -> Done:
        """Marks a trigger or a completion decided now, and again when its transaction commits."""
        trace = self.trace
        assert trace is not None
        marks: list[tuple[str, int, str]] = []
        for event in events:
            if isinstance(event, TriggerCheckpoint | NotifyCheckpointComplete):
                decided, committed = (
                    ("triggered", "trigger_committed")
                    if isinstance(event, TriggerCheckpoint)
                    else ("completed", "completion_committed")
                )
                trace.mark(event.job_id, event.checkpoint_id, decided)
                marks.append((event.job_id, event.checkpoint_id, committed))

        def done(error: Exception | None) -> None:
            for job_id, checkpoint_id, step in marks:
                trace.mark(job_id, checkpoint_id, step)

        return done


def _no_finalize(job: OwnedJob, command: FinalizeCheckpoint) -> None:
    raise RuntimeError("the executor was built without a pipeline to finalize checkpoints")


class CheckpointPipeline:
    def __init__(
        self,
        jobs: Mapping[str, OwnedJob],
        executor: CommandExecutor,
        files: MetadataFiles,
        clock: Clock,
        rejections: Rejections,
    ) -> None:
        """``jobs``: the jobs running here (the registry's, read only)."""
        self.jobs, self.executor, self.files, self.clock = jobs, executor, files, clock
        self.rejections = rejections
        self.trace: StepTrace | None = None

    def on_acks(self, records: Sequence[Received]) -> None:
        """Answers of agents, on the loop (step 1)."""
        now = self.clock.now_ms()
        for record in records:
            event = record.event
            job = self.jobs.get(record.key or "")
            if job is None:
                log.info(
                    "answer for a job this instance does not run (%s[%d]@%d) skipped",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                continue
            if not isinstance(event, AcknowledgeCheckpoint | DeclineCheckpoint | AgentHeartbeat):
                skip_unexpected(record)
                continue
            if event.job_id != job.job_id:
                self.rejections.reject(
                    record, _kind(event), f"job id {event.job_id!r} is not the record's key"
                )
                continue
            problem = sender_problem(job.holder(), event.agent_id, event.attempt, _kind(event))
            if problem is not None:
                if isinstance(event, AgentHeartbeat):
                    self.rejections.heartbeat(record, event.agent_id, problem)
                else:
                    self.rejections.reject(record, _kind(event), problem)
                continue
            job.last_seen_ms = now
            if isinstance(event, AgentHeartbeat):
                job.progress = event
            elif isinstance(event, AcknowledgeCheckpoint):
                self._acknowledged(job, record, event, now)
            elif isinstance(event, DeclineCheckpoint):
                self.executor.execute(job, job.core.on_decline(event, now))

    def _acknowledged(
        self, job: OwnedJob, record: Received, event: AcknowledgeCheckpoint, now: int
    ) -> None:
        if self.trace is not None:
            self.trace.mark(event.job_id, event.checkpoint_id, "last_ack_handled")
        result, commands, reason = job.core.on_acknowledge(event, now)
        if result is AckResult.REFUSED:
            self.rejections.reject(record, "acknowledgement", reason or "refused")
        elif result is AckResult.DUPLICATE:
            log.info(
                "duplicate acknowledgement at %s[%d]@%d (checkpoint %d, %s)", record.topic,
                record.partition, record.offset, event.checkpoint_id, event.subtask_id,
            )  # fmt: skip
        self.executor.execute(job, commands)

    def on_timer(self, timer: Timer, now: int) -> None:
        """A timer of a job's core fell due (`Timers.run`); a job gone meanwhile has none."""
        job = self.jobs.get(timer.job_id)
        if job is not None:
            try:
                self.executor.execute(job, job.core.on_timer(timer, now))
            except Exception:
                log.exception("timer %s of job %s failed", timer.kind.value, timer.job_id)

    def finalize(self, job: OwnedJob, command: FinalizeCheckpoint) -> None:
        """Hands the ``_metadata`` write to the file threads (step 3); the checkpoint completes
        (or fails) on the loop once it is written (step 4)."""
        path = f"{command.external_path}/_metadata"

        def data() -> bytes:
            return SnapshotMetadata.from_acknowledgements(
                command.job_id, command.checkpoint_id, command.snapshot_type, command.trigger_ms,
                command.acknowledgements, job.registration.parallelism,
                job.registration.max_parallelism, command.format_type,
            ).to_json(command.external_path)  # fmt: skip

        def written(error: Exception | None) -> None:
            if self.trace is not None and error is None:
                self.trace.mark(command.job_id, command.checkpoint_id, "metadata_written")
            if self.jobs.get(job.job_id) is not job:
                return  # the job ended, restarted or moved meanwhile
            now = self.clock.now_ms()
            if error is not None:
                log.error(
                    "job %s checkpoint %d: writing %s failed: %s",
                    command.job_id, command.checkpoint_id, path, error,
                )  # fmt: skip
                self.executor.execute(
                    job, job.core.on_finalize_failed(command.checkpoint_id, now, str(error))
                )
            elif command.checkpoint_id in job.core.pending:
                self.executor.execute(job, job.core.on_finalized(command.checkpoint_id, now))

        self.files.write(Write(path, data, written))


def _kind(event: AcknowledgeCheckpoint | DeclineCheckpoint | AgentHeartbeat) -> str:
    if isinstance(event, AcknowledgeCheckpoint):
        return "acknowledgement"
    return "decline" if isinstance(event, DeclineCheckpoint) else "heartbeat"
