"""Chaos campaigns against exactly-once, checkpoint ids and the coordinator's guards.

**Kill points** (``python bench/chaos.py [--kill-points 100]``, what ``make chaos`` runs): the
embedded broker, two coordinator processes and two jobs run as a user runs them, each job an
agent process (``sparkpoint agent bench/chaos_job.py:job --restore latest``): the example job
with its exactly-once Kafka sink, and the example job with a file sink whose checkpoints are
discarded when it ends. Then, one kill point after another, at random moments:

- an agent is SIGKILLed, or kills itself at a scripted crash point (``SPARKPOINT_CRASH_AT``:
  mid-batch, after-ack, after-complete, and mid-publish inside the Kafka sink's transaction),
  and is started again with ``--restore latest``;
- a coordinator is SIGKILLed (and a new one started), or SIGSTOPped past the session timeout and
  resumed (a zombie, fenced by its successor);
- the broker is SIGSTOPped past the session timeout and resumed;
- a job that finished is started again with ``--restore latest`` (it finishes at once, or is
  refused because its checkpoints were discarded: either way nothing is emitted twice).

After every kill point the campaign waits for the job to complete a checkpoint again (the
recovery time). At the end the jobs run to their end, and the committed output is compared with
the plain-Python reference: rows lost, rows duplicated. The Kafka output counts a record as
committed when its transaction's marker exists (``sparkpoint.transaction`` header): the embedded
broker shows aborted transactions to ``read_committed`` readers, a real Kafka hides them.
Checkpoint ids reused are counted from the audit topic (triggers of a fenced, older owner are
left out: on a real Kafka their aborted transactions are invisible).

**Bad events** (``--events N``): while a job runs, N records of random bytes, truncated and
bit-flipped events, unknown fingerprints, empty values and well-formed events with hostile values
(ids near 2^63, negative sizes, paths outside the roots and in another job's directory, 100 KB
strings, the running job's id) go to the jobs, acks, control and checkpoint-overrides topics.
The coordinator and the agent must stay up, the job must keep completing checkpoints with exact
output, and no file outside the roots or of another job may change.

Both write their figures to bench/results/chaos.json (each its own section).
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recording import RESULTS_DIR, percentiles, write_results

from sparkpoint.agent.example import generate, payments, reference_output
from sparkpoint.agent.sinks.kafka import TRANSACTION_HEADER
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker, free_port
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    AgentHeartbeat,
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointSettings,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    SinkEpochPublished,
    SnapshotType,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import (
    consumer_config,
    make_admin,
    make_consumer,
    make_producer,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import (
    ACKS,
    CHECKPOINT_EVENTS,
    CHECKPOINT_OVERRIDES,
    CONTROL,
    JOBS,
    SINK_MARKERS,
    create_topics,
)

ROOT = Path(__file__).resolve().parents[1]
PAUSE_S = 8.0
"""SIGSTOP lasts past the 6 s session timeout: the group moves on without the paused member."""
RECOVERY_TIMEOUT_S = 240.0
CRASH_POINTS = ("mid-batch", "after-ack", "after-complete")
Output = tuple[str, str, int, int]


class Kind(enum.Enum):
    AGENT_KILL = "agent SIGKILL"
    CRASH_POINT = "agent crash point"
    COORDINATOR_KILL = "coordinator SIGKILL"
    COORDINATOR_PAUSE = "coordinator SIGSTOP"
    BROKER_PAUSE = "broker SIGSTOP"
    FINISHED_RESTART = "restart of a finished job"


WEIGHTS = {
    Kind.AGENT_KILL: 4,
    Kind.COORDINATOR_KILL: 2,
    Kind.COORDINATOR_PAUSE: 1,
    Kind.BROKER_PAUSE: 1,
    Kind.FINISHED_RESTART: 2,
}
CRASH_ARMED = 0.4
"""How often a (re)started agent carries a scripted crash point."""


def log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


# --- the processes ------------------------------------------------------------------------------


@dataclass
class Coordinator:
    process: subprocess.Popen[bytes]
    url: str

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)


@dataclass
class ChaosJob:
    name: str
    sink: str
    output: str
    retention: str | None
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    armed: str | None = None
    finished: bool = False
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Recovery:
    job: str
    kind: Kind
    fault_at: float
    seconds: float | None = None


class Campaign:
    def __init__(
        self,
        root: Path,
        bootstrap: str,
        broker: EmbeddedBroker | None,
        records: int,
        max_records: int,
        seed: int,
        jobs: tuple[str, ...] = ("kafka", "files"),
    ) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.broker = broker
        self.records = records
        self.rng = random.Random(seed)
        self.codec = EventCodec()
        self.prefix = f"c{uuid.uuid4().hex[:8]}."
        self.env = dict(os.environ, SPARKPOINT_TOPIC_PREFIX=self.prefix, PYTHONPATH=str(ROOT))
        os.environ["SPARKPOINT_TOPIC_PREFIX"] = self.prefix  # this process reads the same topics
        self.input = f"chaos-payments-{uuid.uuid4().hex[:6]}"
        self.max_records = max_records
        self.config = root / "coordinator.yaml"
        self.config.write_text(
            f"execution.checkpointing.dir: {root / 'checkpoints'}\n"
            f"execution.checkpointing.savepoint-dir: {root / 'savepoints'}\n"
        )
        self.coordinators: list[Coordinator] = []
        self.jobs: dict[str, ChaosJob] = {}
        for sink in jobs:
            name = f"chaos-{sink}-{uuid.uuid4().hex[:6]}"
            output = f"{name}-out" if sink == "kafka" else str(root / f"{name}-out")
            retention = None if sink == "kafka" else "NO_EXTERNALIZED_CHECKPOINTS"
            self.jobs[name] = ChaosJob(name, sink, output, retention, root / "logs")
        self.recoveries: list[Recovery] = []
        self.kill_points: Counter[str] = Counter()
        self.problems: list[str] = []
        self.completions: dict[str, list[float]] = {name: [] for name in self.jobs}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # --- setup ----------------------------------------------------------------------------------

    def start(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        create_topics(make_admin(self.bootstrap), partitions=4)
        from confluent_kafka.admin import NewTopic

        admin = make_admin(self.bootstrap)
        admin.create_topics([NewTopic(self.input, 4, 1)])[self.input].result(30)
        for job in self.jobs.values():
            if job.sink == "kafka":
                admin.create_topics([NewTopic(job.output, 4, 1)])[job.output].result(30)
        generate(self.bootstrap, self.input, self.records)
        log(f"input: {self.records:,} payments on {self.input}")
        threading.Thread(target=self._watch, name="watch", daemon=True).start()
        for _ in range(2):
            self.coordinators.append(self._coordinator())
        for job in self.jobs.values():
            self._start_agent(job)

    def _coordinator(self) -> Coordinator:
        port = free_port()
        out = open(self.root / "logs" / f"coordinator-{port}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "sparkpoint.cli", "-v", "coordinator", "--bootstrap",
             self.bootstrap, "--rest-port", str(port), "--config", str(self.config)],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out.close()
        return Coordinator(process, f"http://127.0.0.1:{port}")

    def _start_agent(self, job: ChaosJob, *extra: str, crash: str | None = None) -> None:
        env = dict(
            self.env,
            CHAOS_JOB_NAME=job.name,
            CHAOS_INPUT=self.input,
            CHAOS_OUTPUT=job.output,
            CHAOS_SINK=job.sink,
            CHAOS_MAX_RECORDS=str(self.max_records),
        )
        if job.retention:
            env["CHAOS_RETENTION"] = job.retention
        env.pop("SPARKPOINT_CRASH_AT", None)
        if crash:
            env["SPARKPOINT_CRASH_AT"] = crash
        job.armed = crash
        job.starts += 1
        out = open(job.log_dir / f"{job.name}-{job.starts}.log", "wb")  # noqa: SIM115
        job.process = subprocess.Popen(
            [sys.executable, "-m", "sparkpoint.cli", "-v", "agent", "bench/chaos_job.py:job",
             "--bootstrap", self.bootstrap, "--master", "local[2]",
             "--checkpoint-dir", str(self.root / "checkpoints"), "--restore", "latest", *extra],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out.close()

    def _arm(self, job: ChaosJob) -> str | None:
        if self.rng.random() >= CRASH_ARMED:
            return None
        points = [*CRASH_POINTS, "mid-publish"] if job.sink == "kafka" else list(CRASH_POINTS)
        return f"{self.rng.choice(points)}:{self.rng.randint(1, 3)}"

    # --- watching the audit topic ------------------------------------------------------------------

    def _watch(self) -> None:
        consumer = make_consumer(self.bootstrap)
        from confluent_kafka import TopicPartition

        topic = CHECKPOINT_EVENTS.name()
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while not self._stop.is_set():
            for message in consumer.consume(500, 0.2):
                if message.error() is not None or message.value() is None:
                    continue
                try:
                    event = self.codec.decode(message.value())
                except ValueError:
                    continue
                if (
                    isinstance(event, CheckpointLifecycleEvent)
                    and event.event_type is CheckpointEventType.COMPLETED
                    and event.job_id in self.completions
                ):
                    with self._lock:
                        self.completions[event.job_id].append(time.monotonic())
        consumer.close()

    def _completed_since(self, job: str, since: float) -> bool:
        with self._lock:
            return any(t > since for t in self.completions[job])

    # --- the campaign -------------------------------------------------------------------------------

    def run(self, kill_points: int, plan: list[Kind] | None = None) -> None:
        """``kill_points`` at random (or the ``plan``'s, in order), then every job to its end,
        then a restart of each finished job."""
        self._settle(self._running_jobs())
        planned = list(plan or [])
        while sum(self.kill_points.values()) < kill_points or planned:
            self._reap()
            kinds = [k for k in WEIGHTS if self._applicable(k)]
            if not kinds:
                break
            kind = (
                planned.pop(0)
                if planned
                else self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
            )
            time.sleep(self.rng.uniform(0.2, 4.0))  # a random moment
            self._reap()
            if self._applicable(kind):
                self._apply(kind)
        log("kill points done; the jobs run to their end")
        for job in self.jobs.values():
            self._finish(job)
        for job in self.jobs.values():
            log(f"#{sum(self.kill_points.values()) + 1} {Kind.FINISHED_RESTART.value}: {job.name}")
            self._restart_finished(job)
            self.kill_points[Kind.FINISHED_RESTART.value] += 1

    def _running_jobs(self) -> list[ChaosJob]:
        return [j for j in self.jobs.values() if not j.finished]

    def _applicable(self, kind: Kind) -> bool:
        running = [j for j in self._running_jobs() if j.running]
        if kind is Kind.FINISHED_RESTART:
            return any(j.finished for j in self.jobs.values())
        if kind is Kind.AGENT_KILL:
            return bool(running)
        if kind is Kind.BROKER_PAUSE:
            return self.broker is not None and bool(running)
        return bool(running)

    def _apply(self, kind: Kind) -> None:
        number = sum(self.kill_points.values()) + 1
        if kind is Kind.FINISHED_RESTART:
            job = self.rng.choice([j for j in self.jobs.values() if j.finished])
            log(f"#{number} {kind.value}: {job.name}")
            self._restart_finished(job)
            self.kill_points[kind.value] += 1
            return
        job = self.rng.choice([j for j in self._running_jobs() if j.running])
        fault_at = time.monotonic()
        if kind is Kind.AGENT_KILL:
            log(f"#{number} {kind.value}: {job.name}")
            assert job.process is not None
            job.process.kill()
            job.process.wait()
            self._start_agent(job, crash=self._arm(job))
        elif kind is Kind.COORDINATOR_KILL:
            victim = self.rng.choice(self.coordinators)
            log(f"#{number} {kind.value}: {victim.url}")
            victim.signal(signal.SIGKILL)
            victim.process.wait()
            self.coordinators.remove(victim)
            self.coordinators.append(self._coordinator())
        elif kind is Kind.COORDINATOR_PAUSE:
            victim = self.rng.choice(self.coordinators)
            log(f"#{number} {kind.value}: {victim.url} for {PAUSE_S:.0f} s")
            victim.signal(signal.SIGSTOP)
            self._sleep(PAUSE_S)
            victim.signal(signal.SIGCONT)
        elif kind is Kind.BROKER_PAUSE:
            assert self.broker is not None
            log(f"#{number} {kind.value} for {PAUSE_S:.0f} s")
            self.broker.pause()
            time.sleep(PAUSE_S)
            self.broker.resume()
        self.kill_points[kind.value] += 1
        self._recover(job, kind, fault_at)

    def _recover(self, job: ChaosJob, kind: Kind, fault_at: float) -> None:
        recovery = Recovery(job.name, kind, fault_at)
        self.recoveries.append(recovery)
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            self._reap()
            if self._completed_since(job.name, fault_at) or job.finished:
                recovery.seconds = time.monotonic() - fault_at
                log(f"   recovered in {recovery.seconds:.1f} s")
                return
            time.sleep(0.1)
        self.problems.append(
            f"{job.name} did not recover from {kind.value} in {RECOVERY_TIMEOUT_S:.0f} s"
        )
        log(f"   NOT recovered: {self.problems[-1]}")

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)

    def _settle(self, jobs: list[ChaosJob]) -> None:
        """Until every job completed a first checkpoint (or finished)."""
        start = time.monotonic() - 1
        for job in jobs:
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while not (self._completed_since(job.name, start) or job.finished):
                self._reap()
                if time.monotonic() > deadline:
                    self.problems.append(f"{job.name} never completed a checkpoint")
                    return
                time.sleep(0.2)

    def _reap(self) -> None:
        """Agents that exited: finished, crashed at their armed point, or failed (a problem)."""
        for job in self.jobs.values():
            if job.process is None or job.process.poll() is None:
                continue
            code = job.process.returncode
            job.exits.append(code)
            job.process = None
            if code == 0:
                job.finished = True
                log(f"   {job.name} FINISHED")
            elif code == -signal.SIGKILL and job.armed:
                point = job.armed
                log(
                    f"#{sum(self.kill_points.values()) + 1} {Kind.CRASH_POINT.value}: {job.name} at {point}"
                )
                self.kill_points[f"{Kind.CRASH_POINT.value} {point.split(':')[0]}"] += 1
                self.recoveries.append(Recovery(job.name, Kind.CRASH_POINT, time.monotonic()))
                self._start_agent(job, crash=self._arm(job))
                self._resolve_later(job)
            else:
                self.problems.append(f"{job.name} agent exited with {code} (see {job.log_dir})")
                log(f"   PROBLEM: {self.problems[-1]}")
                self._start_agent(job)

    def _resolve_later(self, job: ChaosJob) -> None:
        recovery = self.recoveries[-1]

        def wait() -> None:
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while time.monotonic() < deadline:
                if self._completed_since(job.name, recovery.fault_at) or job.finished:
                    recovery.seconds = time.monotonic() - recovery.fault_at
                    return
                time.sleep(0.1)

        threading.Thread(target=wait, daemon=True).start()

    def _restart_finished(self, job: ChaosJob) -> None:
        started = time.monotonic()
        self._start_agent(job)
        assert job.process is not None
        code = job.process.wait(RECOVERY_TIMEOUT_S)
        job.process = None
        expected = 0 if job.retention is None else 1  # retained final checkpoint, or refused
        if code != expected:
            self.problems.append(
                f"restart of finished {job.name} exited {code}, expected {expected}"
            )
        self.recoveries.append(
            Recovery(job.name, Kind.FINISHED_RESTART, started, time.monotonic() - started)
        )

    def _finish(self, job: ChaosJob) -> None:
        deadline = time.monotonic() + 20 * RECOVERY_TIMEOUT_S
        while not job.finished and time.monotonic() < deadline:
            if job.process is None:
                self._start_agent(job)
            if job.process is not None and job.process.poll() is not None:
                code = job.process.returncode
                job.exits.append(code)
                job.process = None
                if code == 0:
                    job.finished = True
                elif code == -signal.SIGKILL and job.armed:
                    job.armed = None  # its crash point, armed before the campaign ended: expected
                else:
                    self.problems.append(f"{job.name} agent exited with {code} while finishing")
                    self._start_agent(job)
            time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        for job in self.jobs.values():
            if job.process is not None and job.process.poll() is None:
                job.process.kill()
        for coordinator in self.coordinators:
            coordinator.signal(signal.SIGCONT)
            coordinator.signal(signal.SIGTERM)
        for coordinator in self.coordinators:
            try:
                coordinator.process.wait(15)
            except subprocess.TimeoutExpired:
                coordinator.process.kill()

    # --- verdicts ---------------------------------------------------------------------------------

    def verdict(self) -> dict[str, Any]:
        expected = reference_output(payments(self.records), end_of_input=True)
        lost = duplicated = 0
        per_job = {}
        for job in self.jobs.values():
            got = (
                committed_kafka_output(self.bootstrap, self.codec, job.name, job.output)
                if job.sink == "kafka"
                else committed_files(Path(job.output))
            )
            missing = Counter(expected) - Counter(got)
            extra = Counter(got) - Counter(expected)
            per_job[job.name] = {
                "sink": job.sink,
                "rows": len(got),
                "lost": sum(missing.values()),
                "duplicated": sum(extra.values()),
                "agent_starts": job.starts,
                "finished": job.finished,
            }
            lost += sum(missing.values())
            duplicated += sum(extra.values())
        reused, stale = reused_checkpoint_ids(self.bootstrap, self.codec, set(self.jobs))
        times = [int(r.seconds * 1000) for r in self.recoveries if r.seconds is not None]
        return {
            "kill_points": sum(self.kill_points.values()),
            "kill_points_by_kind": dict(sorted(self.kill_points.items())),
            "rows_expected_per_job": len(expected),
            "rows_lost": lost,
            "rows_duplicated": duplicated,
            "checkpoint_ids_reused": reused,
            "stale_triggers_from_fenced_owners": stale,
            "recovery_ms": percentiles(times),
            "unrecovered": sum(1 for r in self.recoveries if r.seconds is None),
            "jobs": per_job,
            "problems": self.problems,
        }


# --- reading what was committed ------------------------------------------------------------------


def committed_kafka_output(
    bootstrap: str, codec: EventCodec, job_id: str, topic: str
) -> list[Output]:
    """Records whose transaction has a marker: what a read_committed reader of a real Kafka
    sees (the embedded broker shows aborted transactions too)."""
    tokens = {
        r.event.transaction
        for r in replay_topic(bootstrap, codec, SINK_MARKERS)
        if isinstance(r.event, SinkEpochPublished) and r.event.job_id == job_id
    }
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(consumer_config(bootstrap, read_committed=True))
    out: list[Output] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: true_end_offset(consumer, topic, p) for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is not None:
                    continue
                headers = dict(message.headers() or [])
                token = headers.get(TRANSACTION_HEADER)
                if token is not None and token.decode() not in tokens:
                    continue  # an aborted transaction
                row = json.loads(message.value() or b"{}")
                out.append((row["kind"], row["account"], row["id"], row["value"]))
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    finally:
        consumer.close()
    return sorted(out)


def committed_files(directory: Path) -> list[Output]:
    import pyarrow.parquet as pq

    out: list[Output] = []
    for path in sorted(directory.glob("part-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            out.append((row["kind"], row["account"], row["id"], row["value"]))
    return sorted(out)


def reused_checkpoint_ids(bootstrap: str, codec: EventCodec, jobs: set[str]) -> tuple[int, int]:
    """(ids triggered twice, triggers of a stale owner) per the audit topic, in partition order.
    A trigger whose owner epoch is below one already seen for the job comes from a fenced owner
    whose transaction was aborted: a real Kafka never shows it, the embedded broker does."""
    highest: dict[str, int] = {}
    seen: Counter[tuple[str, int]] = Counter()
    stale = 0
    for record in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS):
        event = record.event
        if not isinstance(event, CheckpointLifecycleEvent) or event.job_id not in jobs:
            continue
        if event.owner_epoch < highest.get(event.job_id, 0):
            stale += 1 if event.event_type is CheckpointEventType.TRIGGERED else 0
            continue
        highest[event.job_id] = event.owner_epoch
        if event.event_type is CheckpointEventType.TRIGGERED:
            seen[(event.job_id, event.checkpoint_id)] += 1
    return sum(1 for n in seen.values() if n > 1), stale


# --- bad events -------------------------------------------------------------------------------------


def hostile_events(
    rng: random.Random,
    codec: EventCodec,
    job_id: str,
    agent_id: str,
    root: Path,
    sentinels: list[Path],
) -> Callable[[], tuple[str, str, bytes | None]]:
    """A maker of one bad record: (topic, key, value)."""
    big = "x" * 100_000
    near = 2**63 - rng.randint(1, 1000)
    outside = [str(p) for p in sentinels]
    subtasks = [Subtask("keyed-0", 0, 0, 63), Subtask("keyed-1", 1, 64, 127)]

    def well_formed() -> tuple[str, Event]:
        choice = rng.randrange(12)
        someone = f"agent-{rng.randrange(10**6)}"
        if choice == 0:
            return JOBS.name(), JobRegistered(
                job_id, big if rng.random() < 0.3 else "x", someone, rng.choice([-1, 0, 2**31 - 1]),
                JobStatus.RUNNING, rng.choice([0, 10**9, 2]), rng.choice([0, 128, 10**9]),
                rng.choice([[], subtasks]), {"execution.checkpointing.dir": rng.choice([*outside, "/etc"])},
                0, restored_checkpoint_id=rng.choice([None, near]),
            )  # fmt: skip
        if choice == 1:
            return JOBS.name(), JobStatusChanged(
                job_id,
                someone,
                rng.randrange(5),
                rng.choice([JobStatus.CANCELED, JobStatus.FINISHED]),
                0,
            )
        if choice == 2:
            handles = [
                StateHandle(
                    rng.choice(outside), StateHandleKind.KEYED_STATE, rng.choice([-5, near])
                )
            ]
            return ACKS.name(), AcknowledgeCheckpoint(
                job_id, rng.choice([near, -3, 1, 10**6]), rng.choice(["keyed-0", "x" * 5000]),
                rng.choice([0, -1]), 0, handles, rng.choice([-1, near]), 0, 0, 0, 0, False,
                agent_id=rng.choice([agent_id, someone, None]),
            )  # fmt: skip
        if choice == 3:
            return ACKS.name(), DeclineCheckpoint(
                job_id, rng.randrange(1, 50), "keyed-0", rng.randrange(3),
                CheckpointFailureReason.CHECKPOINT_DECLINED, 0, big[: rng.randrange(100_000)], agent_id=someone,
            )  # fmt: skip
        if choice == 4:
            return ACKS.name(), AgentHeartbeat(job_id, someone, rng.randrange(10), 0)
        if choice == 5:
            return CONTROL.name(), TriggerCheckpoint(
                job_id, near, near, 0, SnapshotType.CHECKPOINT, True, False, rng.choice(outside),
                agent_id=rng.choice([someone, None]), attempt=rng.randrange(3),
            )  # fmt: skip
        if choice == 6:
            return CONTROL.name(), NotifyCheckpointComplete(
                job_id, near, rng.randrange(1, 100), False, rng.choice(outside), 0,
                agent_id=rng.choice([someone, agent_id]), attempt=0,
            )  # fmt: skip
        if choice == 7:
            return CONTROL.name(), NotifyCheckpointAborted(
                job_id, near, rng.randrange(1, 100), CheckpointFailureReason.CHECKPOINT_EXPIRED, 0,
                agent_id=someone, attempt=0,
            )  # fmt: skip
        if choice == 8:
            return CONTROL.name(), FailoverRequest(
                job_id, near, CheckpointFailureReason.CHECKPOINT_EXPIRED, big, 99, 0,
                restore_external_path=rng.choice(outside), agent_id=someone, attempt=0,
            )  # fmt: skip
        if choice == 9:
            return CONTROL.name(), RegistrationResponse(job_id, near, someone, 7, True, 0)
        if choice == 10:
            return CHECKPOINT_OVERRIDES.name(), CheckpointOverrides(
                job_id, rng.choice([near, -1, 10**6]),
                CheckpointSettings(checkpoint_interval_ms=rng.choice([1, -5, near]), checkpoint_timeout_ms=rng.choice([0, near])),
                big[:1000], 0,
            )  # fmt: skip
        return JOBS.name(), JobRegistered(
            rng.choice(["../../etc", "x" * 5000, ""]), "x", someone, 0, JobStatus.RUNNING, 2, 128,
            subtasks, {}, 0,
        )  # fmt: skip

    topics = [JOBS.name(), ACKS.name(), CONTROL.name(), CHECKPOINT_OVERRIDES.name()]

    def make() -> tuple[str, str, bytes | None]:
        key = job_id if rng.random() < 0.8 else rng.choice(["", "other-job", "x" * 3000])
        kind = rng.randrange(8)
        if kind == 0:
            return rng.choice(topics), key, rng.randbytes(rng.randrange(0, 300))
        topic, event = well_formed()
        encoded = codec.encode(event)
        if kind == 1:
            return topic, key, encoded[: rng.randrange(1, len(encoded))]  # truncated
        if kind == 2:
            flipped = bytearray(encoded)
            position = rng.randrange(len(flipped))
            flipped[position] ^= 1 << rng.randrange(8)
            return topic, key, bytes(flipped)
        if kind == 3:
            return topic, key, b"\xc3\x01" + rng.randbytes(8) + encoded[10:]  # unknown fingerprint
        if kind == 4:
            return rng.choice(topics), key, rng.choice([b"", None])
        return topic, job_id, encoded

    return make


def run_events(count: int, seed: int, records: int) -> dict[str, Any]:
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-chaos-events-"))
    with EmbeddedBroker() as broker:
        campaign = Campaign(root, broker.bootstrap, broker, records, 100, seed, jobs=("kafka",))
        sentinels = [
            root / "outside.txt",
            root / "checkpoints" / "another-job" / "shared" / "kg-00001.arrow",
        ]
        for sentinel in sentinels:
            sentinel.parent.mkdir(parents=True, exist_ok=True)
            sentinel.write_bytes(b"must survive")
        try:
            campaign.start()
            (job,) = campaign.jobs.values()
            campaign._settle([job])
            agent_id = registered_agent(broker.bootstrap, campaign.codec, job.name)
            make = hostile_events(rng, campaign.codec, job.name, agent_id, root, sentinels)
            producer = make_producer(broker.bootstrap)
            started = time.monotonic()
            for _ in range(count):
                topic, key, value = make()
                while True:
                    try:
                        producer.produce(topic, key=key.encode(), value=value)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            producer.flush(60)
            storm_s = time.monotonic() - started
            log(f"{count:,} bad records sent in {storm_s:.1f} s")
            storm_end = time.monotonic()
            completed_during = sum(1 for t in campaign.completions[job.name] if started <= t)
            campaign._finish(job)
            coordinators_alive = all(c.process.poll() is None for c in campaign.coordinators)
            metrics = scrape(campaign.coordinators)
            verdict = campaign.verdict()
        finally:
            campaign.stop()
    survived = all(s.read_bytes() == b"must survive" for s in sentinels)
    completed_after = sum(1 for t in campaign.completions[job.name] if t > storm_end)
    return {
        "bad_records": count,
        "storm_seconds": round(storm_s, 1),
        "coordinators_up": coordinators_alive,
        "agent_exit_codes": job.exits,
        "checkpoints_completed_during_storm": completed_during,
        "checkpoints_completed_after": completed_after,
        "rows_lost": verdict["rows_lost"],
        "rows_duplicated": verdict["rows_duplicated"],
        "checkpoint_ids_reused": verdict["checkpoint_ids_reused"],
        "files_outside_roots_or_of_other_jobs_untouched": survived,
        "coordinator_counters": metrics,
        "problems": verdict["problems"],
    }


def registered_agent(bootstrap: str, codec: EventCodec, job_id: str) -> str:
    agents = [
        r.event.agent_id
        for r in replay_topic(bootstrap, codec, JOBS)
        if isinstance(r.event, JobRegistered) and r.event.job_id == job_id
    ]
    return agents[-1] if agents else "agent-unknown"


def scrape(coordinators: list[Coordinator]) -> dict[str, int]:
    import httpx

    totals: Counter[str] = Counter()
    for coordinator in coordinators:
        try:
            text = httpx.get(f"{coordinator.url}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            if line.startswith(
                ("sparkpoint_malformed_events_total", "sparkpoint_rejected_events_total")
            ):
                name, _, value = line.rpartition(" ")
                totals[name.split("{")[0]] += int(float(value))
    return dict(totals)


# --- the command --------------------------------------------------------------------------------------


def run_kill_points(
    kill_points: int,
    records: int,
    max_records: int,
    seed: int,
    plan: list[Kind] | None = None,
    jobs: tuple[str, ...] = ("kafka", "files"),
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-chaos-"))
    log(f"chaos campaign: {kill_points} kill points, {records:,} payments, under {root}")
    started = time.monotonic()
    with EmbeddedBroker(log_file=root / "broker.log") as broker:
        campaign = Campaign(root, broker.bootstrap, broker, records, max_records, seed, jobs)
        try:
            campaign.start()
            campaign.run(kill_points, plan)
            verdict = campaign.verdict()
        finally:
            campaign.stop()
    verdict["seconds"] = round(time.monotonic() - started)
    verdict["logs"] = str(root / "logs")
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-points", type=int, default=100)
    parser.add_argument("--records", type=int, default=150_000)
    parser.add_argument("--max-records", type=int, default=400, help="per partition and round")
    parser.add_argument(
        "--events", type=int, help="run the bad-event campaign with N records instead"
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument(
        "--label", help="keep this run beside the others in chaos.json: kill_points_<label>"
    )
    args = parser.parse_args()
    path = RESULTS_DIR / "chaos.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous.pop("machine", None)
    previous.pop("measured_at", None)
    if args.events:
        result = run_events(args.events, args.seed, args.records)
        section = "bad_events"
        ok = (
            result["coordinators_up"]
            and result["agent_exit_codes"][-1:] == [0]
            and not result["rows_lost"]
            and not result["rows_duplicated"]
            and result["files_outside_roots_or_of_other_jobs_untouched"]
        )
    else:
        result = run_kill_points(args.kill_points, args.records, args.max_records, args.seed)
        section = f"kill_points_{args.label}" if args.label else "kill_points"
        ok = not (
            result["rows_lost"] or result["rows_duplicated"] or result["checkpoint_ids_reused"]
        )
    result["seed"] = args.seed
    print(json.dumps(result, indent=2))
    written = write_results("chaos", {**previous, "benchmark": "chaos", section: result})
    print(f"wrote {written}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
