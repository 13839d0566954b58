"""A scripted agent for coordinator tests and benchmarks: it registers a job on the real broker
and answers each trigger as its script says (acknowledge after a delay, decline, hang, crash,
acknowledge twice). It writes a small real state file per acknowledgement, records every control
event it sees, sends heartbeats, and drops control events from an older ownership epoch or
addressed to another agent or attempt, as real agents do."""

from __future__ import annotations

import enum
import heapq
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    AgentHeartbeat,
    CancelJob,
    CheckpointFailureReason,
    DeclineCheckpoint,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import EventPublisher, EventSubscriber, make_consumer, make_producer
from sparkpoint.common.keygroups import key_group_range
from sparkpoint.common.limits import HEARTBEAT_INTERVAL_MS
from sparkpoint.common.topics import ACKS, CONTROL, JOBS


class Action(enum.Enum):
    ACK = "ack"
    DECLINE = "decline"
    HANG = "hang"
    CRASH = "crash"
    ACK_TWICE = "ack-twice"


@dataclass(frozen=True)
class Answer:
    action: Action = Action.ACK
    delay_s: float = 0.0


Script = Callable[[TriggerCheckpoint, str], Answer]


def always(answer: Answer) -> Script:
    return lambda trigger, subtask: answer


@dataclass
class ScriptedAgent:
    bootstrap: str
    codec: EventCodec
    job_id: str
    parallelism: int = 2
    configuration: dict[str, str] = field(default_factory=dict)
    script: Script = field(default_factory=lambda: always(Answer()))
    state_dir: Path | None = None
    attempt: int = 0
    heartbeat: bool = True
    agent_id: str = ""
    end_on_cancel: bool = False

    def __post_init__(self) -> None:
        self.agent_id = self.agent_id or f"scripted-{uuid.uuid4().hex[:6]}"
        self.subtasks = [f"keyed-{i}" for i in range(self.parallelism)]
        self.publisher = EventPublisher(
            make_producer(self.bootstrap, one_record_per_batch=True), self.codec
        )
        self.triggers: list[TriggerCheckpoint] = []
        self.completed: list[NotifyCheckpointComplete] = []
        self.aborted: list[NotifyCheckpointAborted] = []
        self.failovers: list[FailoverRequest] = []
        self.cancels: list[CancelJob] = []
        self.stale: int = 0
        self.partition = -1
        self._epoch = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.responses: list[RegistrationResponse] = []
        self._due: list[tuple[float, int, AcknowledgeCheckpoint | DeclineCheckpoint]] = []
        self._sequence = 0
        self._next_heartbeat = 0.0

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ScriptedAgent:
        self.register()
        self._thread = threading.Thread(target=self._run, name=f"agent-{self.job_id}", daemon=True)
        self._thread.start()
        return self

    def register(self, status: JobStatus = JobStatus.RUNNING) -> None:
        ranges = [key_group_range(128, self.parallelism, i) for i in range(self.parallelism)]
        registration = JobRegistered(
            self.job_id, f"scripted {self.job_id}", self.agent_id, self.attempt, status, self.parallelism, 128,
            [Subtask(s, i, r.start, r.end) for i, (s, r) in enumerate(zip(self.subtasks, ranges, strict=True))],
            self.configuration, int(time.time() * 1000),
        )  # fmt: skip
        self.partition = self.publisher.publish_sync(JOBS, self.job_id, registration).partition

    def finish(self, status: JobStatus = JobStatus.FINISHED) -> None:
        self.publisher.publish_sync(
            JOBS,
            self.job_id,
            JobStatusChanged(
                self.job_id, self.agent_id, self.attempt, status, int(time.time() * 1000)
            ),
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.publisher.close()

    def wait_for(
        self, condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.02)
        raise AssertionError(
            f"{what} not met within {timeout_s} s (triggers {[t.checkpoint_id for t in self.triggers]}, completed {[c.checkpoint_id for c in self.completed]}, aborted {[(a.checkpoint_id, a.reason.name) for a in self.aborted]})"
        )

    # --- the loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        subscriber = EventSubscriber(make_consumer(self.bootstrap), self.codec)
        subscriber.assign([TopicPartition(CONTROL.name(), self.partition, 0)])
        try:
            while not self._stop.is_set():
                for record in subscriber.poll(0.01):
                    if record.key == self.job_id and record.event is not None:
                        self._on_control(record.event)
                self._send_due()
        finally:
            subscriber.close()

    def _on_control(self, event: object) -> None:
        if isinstance(event, RegistrationResponse):
            if event.agent_id == self.agent_id:
                self.responses.append(event)
            return
        addressed = (getattr(event, "agent_id", None), getattr(event, "attempt", None))
        if addressed[0] is not None and addressed != (self.agent_id, self.attempt):
            return
        epoch = getattr(event, "owner_epoch", 0)
        if epoch < self._epoch:
            self.stale += 1
            return
        self._epoch = epoch
        if isinstance(event, TriggerCheckpoint):
            self.triggers.append(event)
            for subtask in self.subtasks:
                self._answer(event, subtask)
        elif isinstance(event, NotifyCheckpointComplete):
            self.completed.append(event)
        elif isinstance(event, NotifyCheckpointAborted):
            self.aborted.append(event)
        elif isinstance(event, FailoverRequest):
            self.failovers.append(event)
        elif isinstance(event, CancelJob):
            self.cancels.append(event)
            if self.end_on_cancel:
                self.finish(JobStatus.CANCELED)

    def _answer(self, trigger: TriggerCheckpoint, subtask: str) -> None:
        answer = self.script(trigger, subtask)
        if answer.action is Action.HANG:
            return
        if answer.action is Action.CRASH:
            self._stop.set()
            return
        due = time.monotonic() + answer.delay_s
        if answer.action is Action.DECLINE:
            message: AcknowledgeCheckpoint | DeclineCheckpoint = DeclineCheckpoint(
                self.job_id, trigger.checkpoint_id, subtask, self.attempt, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
                int(time.time() * 1000), "scripted decline", agent_id=self.agent_id,
            )  # fmt: skip
        else:
            message = self._acknowledgement(trigger, subtask)
        for _ in range(2 if answer.action is Action.ACK_TWICE else 1):
            self._sequence += 1
            heapq.heappush(self._due, (due, self._sequence, message))

    def _acknowledgement(self, trigger: TriggerCheckpoint, subtask: str) -> AcknowledgeCheckpoint:
        path = f"{trigger.target_location}/{subtask}.state"
        if self.state_dir is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(b"state of " + subtask.encode())
        return AcknowledgeCheckpoint(
            self.job_id, trigger.checkpoint_id, subtask, self.attempt, int(time.time() * 1000),
            [StateHandle(path, StateHandleKind.KEYED_STATE, 64)], 64, 1, 1, 2, 0, trigger.unaligned, 64, 0,
            agent_id=self.agent_id,
        )  # fmt: skip

    def _send_due(self) -> None:
        now = time.monotonic()
        if self.heartbeat and now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_INTERVAL_MS / 1000
            beat = AgentHeartbeat(self.job_id, self.agent_id, self.attempt, int(time.time() * 1000))
            self.publisher.publish_nowait(ACKS, self.job_id, beat)
        while self._due and self._due[0][0] <= now:
            _, _, message = heapq.heappop(self._due)
            self.publisher.publish_nowait(ACKS, self.job_id, message)
        self.publisher.producer.poll(0)
