"""Drives a CheckpointCoordinator the way the service will: a manual clock, a timer queue, and a
record of every command. No sleeps: time moves only through `advance`."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.common.clock import ManualClock, TimerQueue
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    StateHandle,
    StateHandleKind,
    TriggerCheckpoint,
)
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.storage import canonical
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
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.core.pending import AckResult
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter

JOB_ID = "job-0001"
T0 = 1_000_000
JOB_DIR = canonical(f"{CheckpointConfig().checkpoint_dir}/{JOB_ID}")
"""The job's directory under the default checkpoint storage: acknowledged files lie inside."""


def shared(name: str) -> str:
    """A file in the job's shared/ directory (incremental copies)."""
    return f"{JOB_DIR}/shared/{name}"


def subtasks(n: int) -> tuple[str, ...]:
    return tuple(f"keyed-{i}" for i in range(n))


def ack(
    checkpoint_id: int, subtask: str, files: Sequence[str] = (), size: int = 100, at: int = 0
) -> AcknowledgeCheckpoint:
    handles = [StateHandle(path, StateHandleKind.KEYED_STATE, size, shared=True) for path in files]
    return AcknowledgeCheckpoint(
        JOB_ID, checkpoint_id, subtask, 0, at, handles, size * max(1, len(files)), 1, 1, 5, 0, False,
        checkpointed_size_bytes=size, processed_data_bytes=10,
    )  # fmt: skip


def decline(
    checkpoint_id: int,
    subtask: str,
    reason: CheckpointFailureReason = CheckpointFailureReason.CHECKPOINT_DECLINED,
) -> DeclineCheckpoint:
    return DeclineCheckpoint(JOB_ID, checkpoint_id, subtask, 0, reason, 0, "declined in a test")


@dataclass
class Driver:
    coordinator: CheckpointCoordinator
    clock: ManualClock
    auto_finalize: bool = True
    timers: TimerQueue = field(default_factory=TimerQueue)
    commands: list[Command] = field(default_factory=list)
    to_finalize: list[FinalizeCheckpoint] = field(default_factory=list)
    ack_results: list[AckResult] = field(default_factory=list)
    refusals: list[str | None] = field(default_factory=list)

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def run(self, commands: Iterable[Command]) -> None:
        for command in commands:
            self.commands.append(command)
            if isinstance(command, ScheduleTimer):
                self.timers.schedule(command.timer, command.due_ms)
            elif isinstance(command, CancelTimer):
                self.timers.cancel(command.timer)
            elif isinstance(command, FinalizeCheckpoint):
                if self.auto_finalize:
                    self.run(self.coordinator.on_finalized(command.checkpoint_id, self.now))
                else:
                    self.to_finalize.append(command)

    def start(self, **kwargs: Any) -> Driver:
        self.run(self.coordinator.start(self.now, **kwargs))
        return self

    def advance(self, ms: int) -> None:
        """Moves time forward, firing every timer that falls due on the way, in order."""
        target = self.now + ms
        while True:
            due = self.timers.next_due_ms()
            if due is None or due > target:
                break
            self.clock.set(max(due, self.now))
            popped = self.timers.pop_due(self.now)
            assert popped is not None
            timer: Timer = popped[1]  # type: ignore[assignment]
            self.run(self.coordinator.on_timer(timer, self.now))
        self.clock.set(target)

    def acknowledge(self, message: AcknowledgeCheckpoint) -> AckResult:
        result, commands, reason = self.coordinator.on_acknowledge(message, self.now)
        self.ack_results.append(result)
        self.refusals.append(reason)
        self.run(commands)
        return result

    def acknowledge_all(
        self, checkpoint_id: int, only: Iterable[str] | None = None, files: Sequence[str] = ()
    ) -> None:
        for subtask in only if only is not None else self.coordinator.job.subtasks:
            self.acknowledge(ack(checkpoint_id, subtask, files, at=self.now))

    def decline(self, message: DeclineCheckpoint) -> None:
        self.run(self.coordinator.on_decline(message, self.now))

    def configure(self, **changes: Any) -> None:
        import dataclasses

        self.run(
            self.coordinator.apply_config(
                dataclasses.replace(self.coordinator.config, **changes), self.now
            )
        )

    # --- what happened ------------------------------------------------------------------------------

    def events(self, kind: type[Event]) -> list[Any]:
        return [
            c.event for c in self.commands if isinstance(c, Publish) and isinstance(c.event, kind)
        ]

    def triggers(self) -> list[TriggerCheckpoint]:
        return self.events(TriggerCheckpoint)

    def trigger_times(self) -> list[int]:
        return [t.trigger_timestamp for t in self.triggers()]

    def completed(self) -> list[int]:
        return [e.checkpoint_id for e in self.events(NotifyCheckpointComplete)]

    def aborted(self) -> list[tuple[int, CheckpointFailureReason]]:
        return [(e.checkpoint_id, e.reason) for e in self.events(NotifyCheckpointAborted)]

    def failovers(self) -> list[FailoverRequest]:
        return self.events(FailoverRequest)

    def lifecycle(self) -> list[tuple[int, str]]:
        return [(e.checkpoint_id, e.event_type.name) for e in self.events(CheckpointLifecycleEvent)]

    def discarded_files(self) -> list[str]:
        return [f for c in self.commands if isinstance(c, DiscardState) for f in c.discard.files]

    def discarded_directories(self) -> list[str]:
        return [
            c.discard.directory
            for c in self.commands
            if isinstance(c, DiscardState) and c.discard.directory
        ]

    def request_results(self) -> dict[str, RequestCompleted | RequestFailed]:
        return {
            c.request_id: c
            for c in self.commands
            if isinstance(c, RequestCompleted | RequestFailed)
        }

    def last_trigger_id(self) -> int:
        return self.triggers()[-1].checkpoint_id


def coordinator(
    config: CheckpointConfig | None = None, parallelism: int = 2, seed: int = 7, start_ms: int = T0
) -> Driver:
    """A started coordinator for job-0001 with ``parallelism`` subtasks, on a manual clock."""
    config = config or CheckpointConfig(interval_ms=1000, timeout_ms=10_000)
    core = CheckpointCoordinator(
        JobInfo(JOB_ID, subtasks(parallelism)),
        config,
        InMemoryCheckpointIdCounter(),
        random.Random(seed),
    )
    return Driver(core, ManualClock(start_ms)).start()
