"""`sparkpoint demo`: everything embedded, on one machine.

It starts the embedded broker and creates the topics, then runs, as processes a user would start:
a coordinator (REST and dashboard), the history service (every job's history, kept across
restarts and failovers), the generator (payments at a steady rate) and the agent of the bundled
example job on Spark. It prints the REST address and follows the job's checkpoints until
Ctrl-C (or, with ``--once``, until three have completed), then stops everything cleanly.

``--exchange`` instead walks one job through the protocol with a scripted exchange of every event
type (registration, a completed checkpoint, a runtime configuration change, a declined checkpoint,
a failover request, a savepoint, the end of the job): each event is published to its topic, read
back from the broker and printed with where it landed.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint.client import Rest
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker, free_port, port_is_free
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    AgentHeartbeat,
    CancelJob,
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointSettings,
    CheckpointStoreRecord,
    ConfigChange,
    CoordinatorAnnouncement,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    RetainedCheckpoint,
    SinkEpochPublished,
    SnapshotType,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.kafka import (
    EventPublisher,
    Received,
    make_admin,
    make_producer,
    replay_topic,
)
from sparkpoint.common.kafka_config import use_properties_file
from sparkpoint.common.secure_broker import dev_security
from sparkpoint.common.topics import (
    ACKS,
    CHECKPOINT_EVENTS,
    CHECKPOINT_OVERRIDES,
    CHECKPOINT_STORE,
    CONFIG_CHANGES,
    CONTROL,
    COORDINATORS,
    JOBS,
    SINK_MARKERS,
    TopicSpec,
    create_topics,
    print_topics,
)

EMBEDDED_PORT = 9092

Say = Callable[[str], None]


@dataclass(frozen=True)
class Step:
    topic: TopicSpec
    event: Event


def scripted_exchange(job_id: str, now_ms: int) -> list[Step]:
    """One job's life in events, in the order the parts would publish them."""
    subtasks = [Subtask("keyed-0", 0, 0, 63), Subtask("keyed-1", 1, 64, 127)]
    checkpoint_dir = f".sparkpoint/checkpoints/{job_id}"
    epoch = 1
    t = now_ms

    def ack(checkpoint_id: int, subtask: Subtask) -> AcknowledgeCheckpoint:
        handle = StateHandle(
            f"{checkpoint_dir}/shared/kg-{subtask.key_group_start}-{subtask.key_group_end}-v{checkpoint_id}.arrow",
            StateHandleKind.KEYED_STATE,
            48_000,
            subtask.key_group_start,
            subtask.key_group_end,
            shared=True,
        )
        return AcknowledgeCheckpoint(
            job_id, checkpoint_id, subtask.subtask_id, 0, t + 120, [handle], 48_000, 2, 1, 35, 0, False,
            checkpointed_size_bytes=48_000, processed_data_bytes=0,
        )  # fmt: skip

    before = CheckpointSettings(10_000, 600_000, 0, 1, 0, 0)
    after = CheckpointSettings(10_000, 900_000, 0, 1, 0, 0)
    return [
        Step(COORDINATORS, CoordinatorAnnouncement(
            "coordinator-demo", "http://127.0.0.1:8081", [0, 1, 2, 3, 4, 5], {str(p): epoch for p in range(6)}, t - 5,
        )),
        Step(JOBS, JobRegistered(
            job_id, "payments-example", "agent-demo", 0, JobStatus.RUNNING, 2, 128, subtasks,
            {"execution.checkpointing.interval": "10s", "execution.checkpointing.timeout": "10min"}, t,
        )),
        Step(CONTROL, RegistrationResponse(
            job_id, epoch, "agent-demo", 0, True, t + 2, checkpoint_id_counter=1,
        )),
        Step(ACKS, AgentHeartbeat(job_id, "agent-demo", 0, t + 5)),
        Step(CONTROL, TriggerCheckpoint(
            job_id, epoch, 1, t + 10, SnapshotType.CHECKPOINT, True, False, f"{checkpoint_dir}/chk-1",
        )),
        Step(CHECKPOINT_EVENTS, CheckpointLifecycleEvent(
            job_id, epoch, 1, CheckpointEventType.TRIGGERED, SnapshotType.CHECKPOINT, t + 10,
        )),
        Step(ACKS, ack(1, subtasks[0])),
        Step(ACKS, ack(1, subtasks[1])),
        Step(CONTROL, NotifyCheckpointComplete(job_id, epoch, 1, False, f"{checkpoint_dir}/chk-1", t + 130)),
        Step(SINK_MARKERS, SinkEpochPublished(job_id, "payment-stats", 1, 1_250, "agent-demo", t + 135)),
        Step(CHECKPOINT_EVENTS, CheckpointLifecycleEvent(
            job_id, epoch, 1, CheckpointEventType.COMPLETED, SnapshotType.CHECKPOINT, t + 130,
            external_path=f"{checkpoint_dir}/chk-1", duration_ms=120, state_size_bytes=96_000,
        )),
        Step(CHECKPOINT_STORE, CheckpointStoreRecord(job_id, epoch, 2, [RetainedCheckpoint(
            1, SnapshotType.CHECKPOINT, True, t + 10, t + 130, f"{checkpoint_dir}/chk-1", 96_000,
            [f"{checkpoint_dir}/shared/kg-0-63-v1.arrow", f"{checkpoint_dir}/shared/kg-64-127-v1.arrow"],
        )], t + 131)),
        Step(CHECKPOINT_OVERRIDES, CheckpointOverrides(
            job_id, 1, CheckpointSettings(checkpoint_timeout_ms=900_000), "req-demo-1", t + 200,
        )),
        Step(CONFIG_CHANGES, ConfigChange(
            job_id, "req-demo-1", "demo", t + 201, before, after, ["checkpointTimeout"], 1,
        )),
        Step(CONTROL, TriggerCheckpoint(
            job_id, epoch, 2, t + 10_010, SnapshotType.CHECKPOINT, True, False, f"{checkpoint_dir}/chk-2",
        )),
        Step(ACKS, DeclineCheckpoint(
            job_id, 2, "keyed-1", 0, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, t + 10_050,
            "upload to checkpoint storage failed",
        )),
        Step(CONTROL, NotifyCheckpointAborted(
            job_id, epoch, 2, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, t + 10_051,
            "keyed-1: upload to checkpoint storage failed",
        )),
        Step(CHECKPOINT_EVENTS, CheckpointLifecycleEvent(
            job_id, epoch, 2, CheckpointEventType.FAILED, SnapshotType.CHECKPOINT, t + 10_051,
            failure_reason=CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, duration_ms=41,
        )),
        Step(CONTROL, FailoverRequest(
            job_id, epoch, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
            "1 consecutive failure > 0 tolerable", 1, t + 10_052, failed_checkpoint_id=2,
            restore_checkpoint_id=1, restore_external_path=f"{checkpoint_dir}/chk-1",
        )),
        Step(CONTROL, TriggerCheckpoint(
            job_id, epoch, 3, t + 20_000, SnapshotType.SAVEPOINT_TERMINATE, False, False,
            f".sparkpoint/savepoints/savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}",
        )),
        Step(JOBS, JobStatusChanged(job_id, "agent-demo", 1, JobStatus.FINISHED, t + 20_500)),
        # a cancellation that arrives after the job ended: agents of the ended job ignore it
        Step(CONTROL, CancelJob(job_id, epoch, t + 21_000, "demo@127.0.0.1", "agent-demo", 1)),
    ]  # fmt: skip


def describe(event: Event) -> str:
    """A one-line, human summary of an event."""
    match event:
        case JobRegistered():
            return f"job {event.job_name} registered: parallelism {event.parallelism}, {len(event.subtasks)} subtasks"
        case JobStatusChanged():
            return f"job is {event.status.name}"
        case TriggerCheckpoint():
            return f"trigger {event.snapshot_type.name.lower()} {event.checkpoint_id} -> {event.target_location}"
        case AcknowledgeCheckpoint():
            return f"{event.subtask_id} acknowledges {event.checkpoint_id}: {event.state_size_bytes} bytes, async {event.async_duration_ms} ms"
        case DeclineCheckpoint():
            return f"{event.subtask_id} declines {event.checkpoint_id}: {event.reason.name}"
        case NotifyCheckpointComplete():
            return f"checkpoint {event.checkpoint_id} complete at {event.external_path}"
        case NotifyCheckpointAborted():
            return f"checkpoint {event.checkpoint_id} aborted: {event.reason.name}"
        case CancelJob():
            return f"cancel requested by {event.requested_by}"
        case FailoverRequest():
            return f"failover: restore checkpoint {event.restore_checkpoint_id} ({event.message})"
        case CheckpointOverrides():
            return f"override v{event.version}: timeout {event.overrides.checkpoint_timeout_ms} ms"
        case ConfigChange():
            return f"{event.principal} changed {', '.join(event.changed_fields)}: {event.old.checkpoint_timeout_ms} -> {event.new.checkpoint_timeout_ms} ms"
        case CheckpointLifecycleEvent():
            return f"checkpoint {event.checkpoint_id} {event.event_type.name}"
        case SinkEpochPublished():
            return f"sink {event.sink}: epoch {event.epoch} published ({event.records} records)"
        case CoordinatorAnnouncement():
            return (
                f"{event.instance_id} serves {event.rest_url}, owns partitions {event.partitions}"
            )
        case CheckpointStoreRecord():
            return f"store: next id {event.checkpoint_id_counter}, retained {[r.checkpoint_id for r in event.retained]}"
        case RegistrationResponse():
            verdict = "accepted" if event.accepted else f"refused ({event.reason})"
            return f"registration of {event.agent_id} attempt {event.attempt} {verdict}"
        case AgentHeartbeat():
            return f"{event.agent_id} attempt {event.attempt} is alive"
    raise TypeError(f"not an event: {event!r}")


def run_exchange(bootstrap: str, codec: EventCodec, say: Say) -> list[Received]:
    """Publishes the scripted exchange, reads every topic back, prints what arrived, in order."""
    job_id = f"demo-{uuid.uuid4().hex[:8]}"
    steps = scripted_exchange(job_id, int(time.time() * 1000))
    # One record per batch: the topics are read back to their end offsets (see broker.py).
    publisher = EventPublisher(make_producer(bootstrap, one_record_per_batch=True), codec)
    delivered = [publisher.publish_sync(step.topic, job_id, step.event) for step in steps]
    publisher.close()

    received: dict[tuple[str, int, int], Received] = {}
    for topic in {step.topic.name() for step in steps}:
        for record in replay_topic(bootstrap, codec, topic):
            received[(record.topic, record.partition, record.offset)] = record

    say(f"scripted exchange for job {job_id} (published, then read back from the broker):")
    width = max(len(d.topic) for d in delivered) + 8
    echoed = []
    for step, where in zip(steps, delivered, strict=True):
        arrived = received.get((where.topic, where.partition, where.offset))
        if arrived is None or arrived.event != step.event:
            raise RuntimeError(f"{where.topic}[{where.partition}]@{where.offset} did not read back")
        echoed.append(arrived)
        position = f"{where.topic}[{where.partition}]@{where.offset}"
        say(f"  {position:<{width}}  {type(step.event).__name__:<24}  {describe(step.event)}")
    return echoed


def wait_for_interrupt() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


DEMO_DIR = Path(".sparkpoint/demo")
CHECKPOINTS_TO_SHOW = 3
"""``--once`` stops after this many completed checkpoints, once output was committed too."""
ONCE_WITHIN_S = 180.0
"""``--once`` fails when no output was committed this long after the start: Spark's start
(10-20 s), then a few checkpoint intervals."""
GENERATOR_RATE = 2_000
"""Payments per second: enough to see state grow, little enough for a laptop's two cores."""


def run(
    bootstrap: str | None,
    partitions: int,
    once: bool,
    say: Say,
    rest_port: int = 8081,
    exchange: bool = False,
    flink_web_ui: Path | None = None,
    secure: bool = False,
) -> None:
    codec = EventCodec()
    broker: EmbeddedBroker | None = None
    try:
        if bootstrap is None:
            broker = embedded_broker(secure, say)
            bootstrap = broker.bootstrap
        else:
            say(f"broker: {bootstrap}")
        print_topics(create_topics(make_admin(bootstrap), partitions=partitions), say)
        if exchange:
            run_exchange(bootstrap, codec, say)
            if not once:
                say(f"the broker stays up at {bootstrap}; Ctrl-C to stop")
                wait_for_interrupt()
                say("stopping")
            return
        run_pipeline(bootstrap, rest_port, once, say, flink_web_ui)
    finally:
        if broker is not None:
            broker.stop()


SECURE_DIR = Path(".sparkpoint/secure")
"""``--secure``'s development CA, user and client.properties: kept across runs (the demo's own
folder is emptied at each start)."""


def embedded_broker(secure: bool, say: Say) -> EmbeddedBroker:
    """The demo's broker; ``secure``: behind its TLS/SASL front, this process and every process
    it starts configured with the client file that reaches it."""
    port = EMBEDDED_PORT if port_is_free(EMBEDDED_PORT) else free_port()
    if not secure:
        broker = EmbeddedBroker(port=port).start()
        say(f"broker: {broker.bootstrap} (embedded tansu, memory only)")
        return broker
    dev = dev_security(SECURE_DIR.resolve())
    use_properties_file(dev.client_config)
    broker = EmbeddedBroker(port=port, security=dev.security).start()
    say(f"broker: {broker.bootstrap} (embedded tansu behind TLS + SCRAM-SHA-512; clients: "
        f"--kafka-config {dev.client_config})")  # fmt: skip
    return broker


def run_pipeline(
    bootstrap: str, rest_port: int, once: bool, say: Say, flink_web_ui: Path | None = None
) -> None:
    """Coordinator, generator and agent as processes; follows the checkpoints over REST.
    ``flink_web_ui``: the coordinator also serves Flink's dashboard from it, at /flink/."""
    from sparkpoint.agent.example import OUTPUT_TOPIC

    if not port_is_free(rest_port):
        rest_port = free_port()
    root = DEMO_DIR.resolve()
    shutil.rmtree(root, ignore_errors=True)  # the broker is new and empty: so is the demo's state
    root.mkdir(parents=True)
    demo = DemoProcesses(root, bootstrap, rest_port, say)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        demo.start(flink_web_ui)
        follow = Follow(demo.url, demo.job_id, bootstrap, say)
        deadline = time.monotonic() + ONCE_WITHIN_S
        while not stop.is_set():
            demo.check()
            follow.step()
            if once and follow.completed >= CHECKPOINTS_TO_SHOW and follow.committed_records():
                say(f"output committed: {follow.committed} records in {OUTPUT_TOPIC}")
                break
            if once and time.monotonic() > deadline:
                raise RuntimeError(
                    f"no output committed within {ONCE_WITHIN_S:.0f} s ({follow.completed} "
                    f"checkpoints completed, {follow.processed} records read, lag {follow.lag}); "
                    f"see {root}/agent.log"
                )
            stop.wait(1.0)
        say("stopping")
    finally:
        demo.stop()


class DemoProcesses:
    """The demo's history service, coordinator, generator and agent, each a process as a user
    would start it, logging under ``root``."""

    def __init__(self, root: Path, bootstrap: str, rest_port: int, say: Say) -> None:
        self.root, self.bootstrap, self.say = root, bootstrap, say
        self.url = f"http://127.0.0.1:{rest_port}"
        self.rest_port = rest_port
        history_port = rest_port + 1 if port_is_free(rest_port + 1) else free_port()
        self.history_port = history_port
        self.history_url = f"http://127.0.0.1:{history_port}"
        from sparkpoint.agent.example import example_job

        self.job_id = example_job().id
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []

    def _start(self, name: str, *args: str) -> None:
        cli = [sys.executable, "-m", "sparkpoint.cli", "-v"]
        with open(self.root / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            process = subprocess.Popen([*cli, *args], stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((name, process))

    def start(self, flink_web_ui: Path | None) -> None:
        root, bootstrap, say, url = self.root, self.bootstrap, self.say, self.url
        checkpoints, savepoints = root / "checkpoints", root / "savepoints"
        config = root / "coordinator.yaml"
        config.write_text(
            f"execution.checkpointing.dir: {checkpoints}\nexecution.checkpointing.savepoint-dir: {savepoints}\n"
        )
        web_ui = ["--flink-web-ui", str(flink_web_ui)] if flink_web_ui is not None else []
        self._start("history", "history", "--bootstrap", bootstrap, "--rest-port", str(self.history_port))  # fmt: skip
        self._start(
            "coordinator", "coordinator", "--bootstrap", bootstrap, "--rest-port",
            str(self.rest_port), "--config", str(config), "--history-url", self.history_url,
            *web_ui,
        )  # fmt: skip
        self._start("generator", "generate", "--bootstrap", bootstrap, "--rate", str(GENERATOR_RATE))  # fmt: skip
        self._start("agent", "agent", "example", "--bootstrap", bootstrap, "--checkpoint-dir", str(checkpoints))  # fmt: skip
        say(f"coordinator: {url}  (dashboard: {url}/ , REST: {url}/jobs)")
        if flink_web_ui is not None:
            say(f"Flink's web dashboard: {url}/flink/")
        say(f"history: {self.history_url}/  (every job's checkpoints, configuration changes and "
            "savepoints, kept across restarts and failovers)")  # fmt: skip
        say(f"generator: {GENERATOR_RATE} payments/s to topic payments")
        job = self.job_id
        say(
            f"agent: job {job} (Flink JobID {flink_job_id(job)}) on Spark local[*], "
            f"checkpoints every 3 s under {checkpoints}"
        )
        say(f"logs: {root}/{{coordinator,history,generator,agent}}.log")
        say(f"try: sparkpoint checkpoints {job} --rest {url}   |   sparkpoint savepoint {job} --rest {url}")  # fmt: skip
        say("waiting for Spark to start (10-20 s); Ctrl-C to stop")

    def check(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the {name} exited ({process.returncode}); see {self.root}/{name}.log"
                )

    def stop(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        for name, process in reversed(self.processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"the {name} did not stop in time; killed")
                process.kill()


class Follow:
    """Follows the demo's job over REST: each checkpoint as it ends, with the records read since
    the one before and the current lag; a stall (records waiting, positions not moving) as
    soon as the coordinator shows it; and, for ``--once``, whether output was committed (the
    sink's committed epoch markers count the records they published)."""

    def __init__(self, url: str, job_id: str, bootstrap: str, say: Say) -> None:
        self.url, self.job_id, self.bootstrap, self.say = url, job_id, bootstrap, say
        self.rest = Rest(url)
        self.shown: set[int] = set()
        self.completed = 0
        self.processed = 0
        """Records the job read in this attempt, as its agent last reported."""
        self.reported_at_checkpoint = 0
        self.lag = 0
        self.stalled = False
        self.committed = 0

    def step(self) -> None:
        rest = self.rest
        try:
            progress = rest.call("GET", f"/jobs/{self.job_id}/progress", timeout_s=2)
            history = rest.call("GET", f"/jobs/{self.job_id}/checkpoints", timeout_s=2)
        except Exception:  # not registered yet, or the coordinator is starting
            return
        if progress.get("reported"):
            if progress["records_in"] < self.processed:  # a restarted attempt counts anew
                self.reported_at_checkpoint = 0
            self.processed, self.lag = progress["records_in"], progress["lag"]
            if progress["stalled"] and not self.stalled:
                self.say(
                    f"  STALLED: lag {self.lag} records and the source has not advanced for 10 s"
                )
            self.stalled = progress["stalled"]
        for entry in sorted(history["history"], key=lambda e: e["id"]):
            if entry["id"] in self.shown or entry["status"] == "IN_PROGRESS":
                continue
            self.shown.add(entry["id"])
            read = self.processed - self.reported_at_checkpoint
            self.reported_at_checkpoint = self.processed
            self.say(describe_checkpoint(entry, read, self.lag))
            self.completed += entry["status"] == "COMPLETED"

    def committed_records(self) -> int:
        """Records the job's sink committed so far (its committed epoch markers)."""
        from sparkpoint.common.events import SinkEpochPublished

        markers = replay_topic(self.bootstrap, EventCodec(), SINK_MARKERS, read_committed=True)
        self.committed = sum(
            r.event.records
            for r in markers
            if r.key == self.job_id and isinstance(r.event, SinkEpochPublished)
        )
        return self.committed


def describe_checkpoint(entry: dict[str, Any], read: int | None = None, lag: int = 0) -> str:
    kind = "savepoint" if entry.get("is_savepoint") else "checkpoint"
    work = f", {read:,} records read since the last, lag {lag:,}" if read is not None else ""
    if entry["status"] == "COMPLETED":
        return (
            f"  {kind} {entry['id']} COMPLETED in {entry['end_to_end_duration']} ms, "
            f"state {entry['state_size'] / 1024:.0f} KiB, {entry['num_acknowledged_subtasks']}/{entry['num_subtasks']} "
            f"subtasks{work}, {entry['external_path']}"
        )
    return f"  {kind} {entry['id']} {entry['status']}{work}: {entry.get('failure_message', '')}"
