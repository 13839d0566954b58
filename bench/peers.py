"""sparkpoint against the stream processors a Python or Spark user would pick instead, and against
a hand-written loop, on one workload and one broker. Writes bench/results/peers.json.

The workload: a 4-partition topic of ``--records`` (1,000,000) JSON records
``{"user": "u<k>", "amount": <1..1000>}`` over 10,000 users (numpy's generator, seed 7), keyed
by user (Kafka's murmur2 partitioner); each system keeps a running sum per user and writes every
updated sum ``{"user", "sum"}``, keyed by user, to an output topic of its own: one output record
per input record (spark-agg: one per user and micro-batch). The systems run one after another,
each as a process of its own (quixstreams and bytewax in .venv-peers: quixstreams needs another
confluent-kafka than sparkpoint pins), on the same embedded broker (tansu); the last record of
each input partition is written in a batch of its own, so the broker's end offsets (right only
for one-record last batches) are right for every system. Settings per system, in the
docstrings of bench/peers/*_job.py and in the results:

- sparkpoint: Spark ``local[2]``, parallelism 2, exactly-once Kafka sink, unaligned checkpoints
  every 1 s (min pause 0), against a coordinator in a process of its own; its work in resident
  tasks, as `sparkpoint agent` runs it on a local master;
- sparkpoint-jobs: the same with a Spark job per round (no resident tasks), as on a cluster;
- quixstreams: exactly-once, RocksDB state, commit interval 1 s;
- bytewax: SQLite recovery, snapshots (epochs) every 1 s, one worker (its default);
- spark-agg: Spark Structured Streaming 4.3, ``groupBy("user").agg(sum)`` in update mode over a
  Python streaming data source (confluent-kafka: Spark ships no Kafka connector here), RocksDB
  state with changelog checkpointing, 1 s triggers, micro-batches of at most 100,000 records;
- spark-tws: the same with ``transformWithStateInPandas`` (one output per record); it does
  about a thousand records a second here, so it stops after 90 s and reports that part
  (``partial``);
- hand-loop: one confluent-kafka consumer and transactional producer in one Python loop, json
  per record, a dict of sums, a transaction a second: the floor of cost (no state checkpoint).

Figures per system:
- records/s including start-up: input records / seconds from launching the process to the end
  of the run (sparkpoint: the job FINISHED, after its final checkpoint and sink commit;
  quixstreams: ``Application.run`` returned after its last commit; bytewax: the dataflow ended;
  Spark: the last micro-batch ended; the loop: its last commit);
- records/s excluding start-up: the same end, from the job's registration (sparkpoint, as
  bench/pipeline.py) or the first record processed (the others: for Spark the first
  micro-batch's start);
- start-up: launch to that start; sparkpoint also to the end of its first round that processed
  records (``first_processed_seconds``); every system to its first output record visible to a
  ``read_committed`` consumer (``first_output_seconds``: the first result a user sees, for
  exactly-once sinks after the first commit);
- checkpoint p50 (ms): sparkpoint's trigger-to-completed duration from the audit topic; the
  others' as their job scripts measure it (``checkpoint_measured_as`` says how);
- CPU (``cpu``): user + system seconds of the system's processes (its process tree, sampled from
  /proc every 0.25 s, with a Spark JVM's threads apart; sparkpoint's coordinator too), per
  million records and as cores busy, with and without start-up, by role (``job-process``,
  ``spark-jvm`` split into ``jvm-driver`` / ``jvm-executor`` / ``jvm-runtime`` (JIT and
  collector), ``spark-python-workers``, ``coordinator``, ``watcher``), and the broker's CPU
  in the same span apart (``broker_seconds``);
- sparkpoint's ``scale_model`` (and sparkpoint-jobs', the one for executors of a cluster): its
  serial (driver) and parallel (executor) CPU per million records and per round, the serial
  fraction they imply and the speedup Amdahl's law predicts at 2, 8 and 32 executors
  (docs/architecture.md): the driver (agent process, driver JVM) as serial, the coordinator
  apart (``serial_fraction_with_coordinator`` counts it too); sparkpoint's job process by its
  own clock from its first turn after registering;
- ``sparkpoint_idle``: what the same job costs per second with nothing to process (an empty
  topic that stays open: no round while nothing arrives, a checkpoint a second, heartbeats), cores busy
  by role over 10 s, and its loop thread's apart; the scale model's serial part less that
  cost per second besides the loop over the run (``serial_fraction_less_the_cost_of_running``)
  estimates the fraction without the driver's cost of running, which Amdahl's law does not
  count as serial (`less_the_cost_of_running`);
- ``sparkpoint_longer``: one sparkpoint run of `LONGER_RECORDS` on a topic of its own, after
  the others, with its scale model and estimate (the serial fraction's goal entry reports both
  runs: ``in_a_longer_run``);
- exact: the whole output topic read back (to its true end offsets) holds exactly one record
  per input record, each the right running sum (none missing, duplicated or wrong), and the last
  sum of every user equals its total computed here in plain Python (spark-agg: every sum right,
  none twice, every user's last the total; a partial run: every sum right, none twice).

``--systems`` runs a subset (bench/results/peers.json is written only when all ran);
``--keep`` keeps the run's directory with every system's log; ``--repeat`` (3) runs every
system that many times, interleaved, and keeps each system's median run (one run of each moved
by a fifth from run to run on this machine, enough to put a ratio on either side of its goal).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from recording import (
    CoordinatorProcess,
    TreeCpu,
    cpu_seconds,
    percentiles,
    process_tree,
    write_results,
)

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker, broker_binary
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent
from sparkpoint.common.kafka import (
    ConsumerProfile,
    consumer_config,
    make_admin,
    partition_of,
    producer_config,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import CHECKPOINT_EVENTS

ROOT = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "peers"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
SYSTEMS = (
    "sparkpoint", "sparkpoint-jobs", "quixstreams", "bytewax", "spark-agg", "spark-tws",
    "hand-loop",
)  # fmt: skip
"""sparkpoint-jobs: sparkpoint with a Spark job per round (``--conf
spark.sparkpoint.residentTasks=false``), as on a cluster, where tasks are not resident: the
scale model's figures for executors come from it (`scale_model`)."""
SPARK_AGG_BATCH = 100_000
"""spark-agg's ``maxOffsetsPerTrigger``: micro-batches of about a second here, so a checkpoint
a second as the others (every micro-batch is one)."""
SPARK_TWS_BATCH = 20_000
SPARK_TWS_LIMIT_S = 90.0
"""transformWithStateInPandas does about a thousand records a second here: the run stops after
this long and reports the rate of the part it did (``partial``)."""
JOBS_OF = {
    # system: (python, job script, extra arguments); "peers" is .venv-peers
    "sparkpoint": ("sparkpoint", "sparkpoint_job.py", []),
    "sparkpoint-jobs": ("sparkpoint", "sparkpoint_job.py", ["--spark-jobs"]),
    "quixstreams": ("peers", "quixstreams_job.py", []),
    "bytewax": ("peers", "bytewax_job.py", []),
    "spark-agg": (
        "sparkpoint", "spark_streaming_job.py",
        ["--query", "agg", "--max-records-per-batch", str(SPARK_AGG_BATCH)],
    ),
    "spark-tws": (
        "sparkpoint", "spark_streaming_job.py",
        ["--query", "tws", "--max-records-per-batch", str(SPARK_TWS_BATCH),
         "--time-limit", str(SPARK_TWS_LIMIT_S)],
    ),
    "hand-loop": ("sparkpoint", "hand_loop_job.py", []),
}  # fmt: skip
PARTITIONS = 4
USERS = 10_000
SEED = 7
MAX_AMOUNT = 1_000
GOALS = {"bytewax": 3.5, "quixstreams": 9.0, "spark-agg": 4.0, "hand-loop": 1.6}
"""sparkpoint's records/s excluding start-up over each peer's, as targets (issue 43)."""
EARLIER_GOALS = {"bytewax": 5.0, "quixstreams": 15.0}
"""The first peers issue's targets, reported beside them."""
RATE_GOAL = 150_000
CHECKPOINT_P50_GOAL_MS = 100
SERIAL_FRACTION_GOAL = 0.02
STARTUP_GOAL_S = 5.0
"""Issue 43: from launching the agent to the first record processed."""
EXECUTORS = (2, 8, 32)

IDLE_SECONDS = 10.0
"""How long sparkpoint's idle run is measured (`idle_rates`)."""
LONGER_RECORDS = 3_000_000
"""sparkpoint's longer run for the scale model (`--longer-records`; 0: none): a run of four
seconds holds the driver JVM compiling what it runs, a cost of starting that a job which runs
for hours spreads thin."""
TOPIC_CONFIG = {"retention.ms": "604800000", "retention.bytes": "-1"}
"""Kafka's defaults, given explicitly: the embedded broker describes only the configs a topic was
created with, and quixstreams derives its changelog topics from the input's retention.ms."""
RESULT_PREFIX = "PEERS-RESULT "
"""As bench/peers/common.py marks the figures line (that module cannot be imported from here:
bench/peers.py shadows the bench/peers directory)."""
SUM_BITS = 40
"""A (user, running sum) pair as one int64: user << 40 | sum (sums stay below 2**40)."""

CHECKPOINT_METHOD = {
    "sparkpoint": "trigger to COMPLETED (duration_ms of CheckpointLifecycleEvent on the audit "
    "topic): barrier alignment, state snapshot of both subtasks, acknowledgements, _metadata",
    "sparkpoint-jobs": "as sparkpoint",
    "quixstreams": "one Checkpoint.commit call (patched with a timer): flush sinks, produce "
    "the state changelog, flush the producer, commit the transaction with the offsets, flush "
    "RocksDB; empty checkpoints are closed, not committed, and not counted",
    "bytewax": "bytewax reports no snapshot duration (its snapshot_duration_seconds metric "
    "times one snapshot() call of one key); measured per epoch: from the input closing it (the "
    "last source partition's snapshot() call) to the recovery partition's fronts table first "
    "showing a later frontier (the epoch a resume would start from), read every 50 ms by a "
    "process of its own (under 1% of a core; so up to 50 ms late, 25 on average)",
    "spark-agg": "per micro-batch (each one a checkpoint): walCommit (the offset log) + "
    "commitOffsets (the commit log) + the state store's commitTimeMs (RocksDB's changelog), "
    "from the query's progress events",
    "spark-tws": "as spark-agg",
    "hand-loop": "one transaction's commit: send_offsets_to_transaction + commit_transaction "
    "(no state is checkpointed: a restart would lose the sums)",
}
SETTINGS = {
    "sparkpoint": {
        "master": "local[2]",
        "parallelism": 2,
        "checkpoint_interval_ms": 1000,
        "checkpoint_min_pause_ms": 0,
        "checkpoint_mode": "unaligned (aligned ones wait for the round in flight: p50 about "
        "half a round, 320-340 ms here, at the same records/s)",
        "state": "keyed value state (int64), vectorized per key group",
        "sink": "KafkaSink, exactly-once",
    },
    "sparkpoint-jobs": {
        "as": "sparkpoint",
        "rounds": "a Spark job per round (--conf spark.sparkpoint.residentTasks=false), as on a "
        "cluster; sparkpoint's own rounds run in resident tasks (a local master)",
    },
    "quixstreams": {
        "processing_guarantee": "exactly-once",
        "commit_interval_s": 1.0,
        "state": "RocksDB with changelog topic (defaults)",
        "processes": 1,
        "sink": "to_topic (in the checkpoint's transaction)",
    },
    "bytewax": {
        "recovery": "SQLite, 1 partition",
        "snapshot_interval_s": 1.0,
        "workers": "1 (the default of python -m bytewax.run)",
        "state": "op.stateful_map",
        "sink": "KafkaSink (not transactional: at-least-once after a resume)",
    },
    "spark-agg": {
        "master": "local[2]",
        "query": 'groupBy("user").agg(sum("amount")), update mode: one output per user and '
        "micro-batch, not per record",
        "source": "a Python streaming data source over confluent-kafka "
        "(bench/peers/spark_streaming_source.py; Spark ships no Kafka connector here)",
        "max_offsets_per_trigger": SPARK_AGG_BATCH,
        "trigger": "processingTime 1 second",
        "state": "RocksDB, changelog checkpointing, 2 shuffle partitions",
        "sink": "foreachBatch producing with confluent-kafka (at-least-once)",
    },
    "spark-tws": {
        "master": "local[2]",
        "query": "transformWithStateInPandas, a StatefulProcessor with one ValueState, one "
        "output per record",
        "max_offsets_per_trigger": SPARK_TWS_BATCH,
        "time_limit_s": SPARK_TWS_LIMIT_S,
        "trigger": "processingTime 1 second",
        "state": "RocksDB, changelog checkpointing, 2 shuffle partitions",
        "sink": "foreachBatch producing with confluent-kafka (at-least-once)",
    },
    "hand-loop": {
        "processes": 1,
        "loop": "consume batches of 10,000, json.loads per record, a dict of sums, "
        "json.dumps and produce per record",
        "transaction_interval_s": 1.0,
        "state": "a dict, not checkpointed",
        "sink": "transactional producer with the consumer's offsets (exactly-once)",
    },
}
JVM_EXECUTOR_THREADS = (
    "Executor task", "Worker Monitor", "Idle Worker Mon", "stdout reader", "stderr reader",
)  # fmt: skip
"""A Spark JVM's threads that belong to its executor in local mode (names as /proc shows them:
15 characters); the JIT and the collector are the ``jvm-runtime``, the rest the driver."""
JVM_RUNTIME_THREADS = ("C1 Compiler", "C2 Compiler", "GC Thread", "G1 ", "VM Thread", "VM Periodic")


@dataclass(frozen=True)
class Workload:
    users: np.ndarray
    amounts: np.ndarray

    @property
    def records(self) -> int:
        return len(self.users)

    def prefix_sums(self) -> np.ndarray:
        """Every (user, running sum) the output must hold, encoded, in input order."""
        sums = pd.Series(self.amounts).groupby(self.users).cumsum().to_numpy()
        return (self.users.astype(np.int64) << SUM_BITS) | sums

    def totals(self) -> dict[int, int]:
        return {
            int(u): int(t) for u, t in pd.Series(self.amounts).groupby(self.users).sum().items()
        }


def workload(records: int, seed: int = SEED) -> Workload:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, USERS, records)
    amounts = rng.integers(1, MAX_AMOUNT + 1, records)
    return Workload(users, amounts)


# --- topics and input --------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str) -> None:
    admin = make_admin(bootstrap)  # kept until the futures are done: they die with it
    new = NewTopic(topic, PARTITIONS, 1, config=TOPIC_CONFIG)
    for future in admin.create_topics([new]).values():
        future.result(15)


def produce_input(bootstrap: str, topic: str, data: Workload) -> None:
    """Records keyed by user, in order. The last record of each partition goes alone in a batch
    after the rest were delivered: the embedded broker's end offset is then the true one."""
    create_topic(bootstrap, topic)
    partition = {u: partition_of(f"u{u}", PARTITIONS) for u in range(USERS)}
    last = {partition[int(u)]: i for i, u in enumerate(data.users)}
    held = set(last.values())
    producer = Producer(producer_config(bootstrap, client_id="peers-input") | {"linger.ms": 20})

    def send(i: int) -> None:
        user = int(data.users[i])
        value = json.dumps({"user": f"u{user}", "amount": int(data.amounts[i])}).encode()
        while True:
            try:
                producer.produce(topic, value, f"u{user}".encode(), partition=partition[user])
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(data.records):
        if i not in held:
            send(i)
        if i % 10_000 == 0:
            producer.poll(0)
    for i in sorted(held):
        if producer.flush(60):
            raise RuntimeError("input records left undelivered")
        send(i)
    if producer.flush(60):
        raise RuntimeError("input records left undelivered")


# --- reading and checking the output -------------------------------------------------------------


def read_json(
    bootstrap: str, topic: str, timeout_s: float = 300.0
) -> list[tuple[dict[str, Any], int, int]]:
    """Every record of ``topic`` (its JSON value, partition, offset), up to the true end offset
    of each partition taken now."""
    config = consumer_config(bootstrap, profile=ConsumerProfile.REPLAY, read_committed=True)
    consumer = Consumer(config)
    found: list[tuple[dict[str, Any], int, int]] = []
    try:
        ends = {p: true_end_offset(consumer, topic, p) for p in range(PARTITIONS)}
        remaining = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in remaining])
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(remaining)} not read to the end")
            for message in consumer.consume(100_000, 0.5):
                if message.error() is not None:
                    raise RuntimeError(f"{topic}: {message.error()}")
                found.append((json.loads(message.value()), message.partition(), message.offset()))
            positions = consumer.position([TopicPartition(topic, p) for p in remaining])
            for position in positions:
                if position.offset >= remaining[position.partition]:
                    del remaining[position.partition]
    finally:
        consumer.close()
    return found


def read_output(bootstrap: str, topic: str, timeout_s: float = 300.0) -> pd.DataFrame:
    """Every record of ``topic`` (user index, sum, partition, offset), up to the true end offset
    of each partition taken now."""
    found = read_json(bootstrap, topic, timeout_s)
    return pd.DataFrame(
        {
            "user": [int(value["user"][1:]) for value, _, _ in found],
            "sum": [int(value["sum"]) for value, _, _ in found],
            "partition": [partition for _, partition, _ in found],
            "offset": [offset for _, _, offset in found],
        },
        dtype="int64",
    )


def check(output: pd.DataFrame, data: Workload) -> dict[str, Any]:
    """Exact: one output per input, each an expected running sum, and every user's last output
    (highest offset) its total. Sums grow strictly per user (amounts are positive), so each
    expected (user, sum) pair occurs exactly once."""
    expected = data.prefix_sums()
    got = (output["user"].to_numpy() << SUM_BITS) | output["sum"].to_numpy()
    known = np.isin(got, expected)
    values, counts = np.unique(got[known], return_counts=True)
    last = output.sort_values(["partition", "offset"]).groupby("user")["sum"].last()
    totals = data.totals()
    wrong_last = sum(1 for u, total in totals.items() if last.get(u) != total)
    result = {
        "output_records": len(output),
        "missing": int(len(expected) - len(values)),
        "duplicates": int((counts - 1).sum()),
        "wrong": int((~known).sum()),
        "users_with_wrong_last_sum": wrong_last,
    }
    result["exact"] = (
        result["output_records"] == data.records
        and result["missing"] == result["duplicates"] == result["wrong"] == wrong_last == 0
    )
    return result


# --- running the systems -------------------------------------------------------------------------


def process_role(pid: int, command: str) -> str:
    """Which part of a system a process of its tree is, by its command line."""
    if "org.apache.spark" in command or command.split(" ", 1)[0].endswith("java"):
        return "spark-jvm"
    if "pyspark.daemon" in command or "pyspark.worker" in command or "pyspark/daemon" in command:
        return "spark-python-workers"
    if "frontier_watcher" in command:
        return "watcher"
    if "sparkpoint.agent.sinks.ahead" in command:
        return "sink-writer"  # the exactly-once sink's fork server and write-ahead processes
    return "job-process"


def jvm_thread_role(_: str, name: str) -> str:
    if name.startswith(JVM_EXECUTOR_THREADS):
        return "jvm-executor"
    if name.startswith(JVM_RUNTIME_THREADS):
        return "jvm-runtime"
    return "jvm-driver"


@dataclass(frozen=True)
class Run:
    launched: float
    figures: dict[str, Any]
    cpu: TreeCpu
    reaped_cpu_s: float
    """The job process and the descendants it reaped, from the kernel (wait4)."""


def run_job(
    python: Path, script: str, args: list[str], log: Path, timeout_s: float, env: dict[str, str]
) -> Run:
    """Runs a job script to its end, its process tree's CPU sampled; its figures are the JSON
    line it prints last."""
    command = [str(python), str(JOBS / script), *args]
    launched = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
        cpu = TreeCpu(
            process.pid, process_role, split_threads=("spark-jvm",), thread_role=jvm_thread_role
        )
        try:
            code, reaped = reap(process, launched + timeout_s)
        except TimeoutError:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{script} did not end within {timeout_s:.0f} s; log: {log}"
            ) from None
        finally:
            cpu.stop()
    lines = log.read_text().splitlines()
    figures = [line[len(RESULT_PREFIX) :] for line in lines if line.startswith(RESULT_PREFIX)]
    if code != 0 or not figures:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"{script} exited {code} without figures; log {log}:\n{tail}")
    return Run(launched, json.loads(figures[-1]), cpu, reaped)


def reap(process: subprocess.Popen[str], deadline: float) -> tuple[int, float]:
    """Waits for ``process`` with wait4, so the kernel's count of its CPU (and of the
    descendants it reaped) comes with its exit code."""
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.05)


class BrokerCpu:
    """The embedded broker's CPU seconds (the processes of this one's tree running its
    binary), read when asked."""

    def __init__(self) -> None:
        self.binary = broker_binary()

    def seconds(self) -> float:
        total = 0.0
        for pid in process_tree():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                if self.binary in command:
                    total += cpu_seconds(Path(f"/proc/{pid}/stat"))
            except OSError:
                continue
        return total


def checkpoint_durations(bootstrap: str, job_id: str) -> list[int]:
    return [
        e.duration_ms
        for r in replay_topic(bootstrap, EventCodec(), CHECKPOINT_EVENTS)
        if isinstance(e := r.event, CheckpointLifecycleEvent)
        and e.job_id == job_id
        and e.event_type is CheckpointEventType.COMPLETED
        and e.duration_ms is not None
    ]


def figures(
    system: str, run: Run, start: float, durations: list[int], records: int
) -> dict[str, Any]:
    done = run.figures["done"]
    including = done - run.launched
    excluding = done - start
    stats = percentiles(durations)
    result: dict[str, Any] = {
        "records_per_second_including_startup": round(records / including),
        "records_per_second_excluding_startup": round(records / excluding),
        "checkpoint_p50_ms": stats.get("p50"),
        "seconds_including_startup": round(including, 2),
        "seconds_excluding_startup": round(excluding, 2),
        "startup_seconds": round(start - run.launched, 2),
        "checkpoint_ms": stats,
        "checkpoint_measured_as": CHECKPOINT_METHOD[system],
        "settings": SETTINGS[system],
        "versions": run.figures["versions"],
    }
    if not durations:
        result["checkpoint_p50_ms_note"] = "no checkpoint duration was measured in this run"
    return result


def cpu_figures(
    run: Run,
    start: float,
    records: int,
    seconds: float,
    extra: dict[str, tuple[float, float]],
    exact: dict[str, float] | None = None,
) -> dict[str, Any]:
    """CPU seconds of the system's processes, in all and from ``start`` (start-up left out),
    per million records and as cores busy; by role. ``extra``: processes of the system outside
    the job's tree (sparkpoint's coordinator), as (seconds at start, seconds at the end);
    ``exact``: a role's seconds after start-up as its process measured them itself (sparkpoint's
    job process: a sample every 0.25 s cannot split a busy start from an idle run exactly)."""
    sampled = run.cpu.total()
    total = max(sampled, run.reaped_cpu_s) + sum(end for _, end in extra.values())
    at_start = run.cpu.at(start) + sum(begin for begin, _ in extra.values())
    excluding = total - at_start
    roles_end = run.cpu.roles() | {role: end for role, (_, end) in extra.items()}
    roles_start = run.cpu.roles_at(start) | {role: begin for role, (begin, _) in extra.items()}
    after_start = {role: value - roles_start.get(role, 0.0) for role, value in roles_end.items()}
    for role, value in (exact or {}).items():
        excluding += value - after_start.get(role, 0.0)
        after_start[role] = value
    return {
        "seconds": round(total, 2),
        "seconds_excluding_startup": round(excluding, 2),
        "seconds_per_million_records": round(total / records * 1e6, 2),
        "seconds_per_million_records_excluding_startup": round(excluding / records * 1e6, 2),
        "cores_busy_excluding_startup": round(excluding / seconds, 2),
        "by_role": {role: round(value, 2) for role, value in sorted(roles_end.items())},
        "by_role_excluding_startup": {
            role: round(value, 2) for role, value in sorted(after_start.items())
        },
        "unattributed_seconds": round(max(0.0, run.reaped_cpu_s - sampled), 2),
        "measured_as": "user + system CPU of the job's process and its descendants from /proc "
        "every 0.25 s (a Spark JVM's threads apart), the total from wait4 when larger; start-up "
        "left out at the start of processing (interpolated between the samples around it); "
        "sparkpoint's job process by its own clock (process_time) from its first turn after "
        "registering to the end of its run",
    }


def run_system(
    system: str,
    bootstrap: str,
    input_topic: str,
    root: Path,
    records: int,
    timeout_s: float,
    run_number: int = 1,
) -> tuple[dict[str, Any], str]:
    """Runs one system over the input (its ``run_number``-th run: an output topic, a state
    directory and a log of its own); returns its figures and its output topic."""
    output = f"peers-{system}-out-{run_number}"
    create_topic(bootstrap, output)
    name = f"peers-{system}-{uuid.uuid4().hex[:8]}"
    # sparkpoint's checkpoints go where the coordinator allows them (its storage roots)
    ours = system.startswith("sparkpoint")
    work_dir = root / ("checkpoints" if ours else f"{system}-{run_number}")
    interpreter, script, extra_args = JOBS_OF[system]
    args = [
        "--bootstrap", bootstrap, "--input", input_topic, "--output", output,
        "--records", str(records), "--work-dir", str(work_dir), "--name", name, *extra_args,
    ]  # fmt: skip
    env = dict(os.environ)
    log = root / f"{system}-{run_number}.log"
    python = Path(sys.executable) if interpreter == "sparkpoint" else PEERS_PYTHON
    if not python.exists():
        raise RuntimeError(
            f"{python} is missing: python3.11 -m venv .venv-peers && "
            ".venv-peers/bin/python -m pip install -r bench/peers-requirements.txt"
        )
    broker = BrokerCpu()
    broker_before = broker.seconds()
    first_output = FirstOutput(bootstrap, output)
    extra: dict[str, tuple[float, float]] = {}
    if ours:
        run, coordinator_cpu = beside_a_coordinator(
            bootstrap, root, lambda: run_job(python, script, args, log, timeout_s, env)
        )
        durations = checkpoint_durations(bootstrap, run.figures["job_id"])
        start = run.figures["registered"]
        extra["coordinator"] = (coordinator_cpu.at(start), coordinator_cpu.total())
    else:
        run = run_job(python, script, args, log, timeout_s, env)
        durations = [round(d) for d in run.figures["checkpoint_durations_ms"]]
        start = run.figures["first_record"]
    consumed = run.figures.get("records", records)
    result = figures(system, run, start, durations, consumed)
    exact = {}
    if "process_cpu_seconds_after_start" in run.figures:
        exact["job-process"] = run.figures["process_cpu_seconds_after_start"]
    result["cpu"] = cpu_figures(
        run, start, consumed, result["seconds_excluding_startup"], extra, exact
    )
    result["cpu"]["broker_seconds"] = round(broker.seconds() - broker_before, 2)
    result["first_output_seconds"] = first_output.seconds_after(run.launched)
    if ours:
        result["restarts"] = run.figures["restarts"]
        result["rounds"] = run.figures["rounds"]
        result["loop_cpu_seconds"] = run.figures["loop_cpu_seconds_after_start"]
        first = run.figures["first_processed"]
        result["first_processed_seconds"] = round(first - run.launched, 2) if first else None
        result["scale_model"] = scale_model(result, records)
    if system == "quixstreams":
        result["seconds_to_last_commit"] = round(run.figures["last_commit_end"] - start, 2)
    if system == "bytewax":
        result["epochs"] = run.figures["epochs"]
        result["watcher_cpu_share"] = run.figures["watcher_cpu_share"]
    if system.startswith("spark-"):
        for key in ("records", "partial", "batches", "max_records_per_batch", "batch_ms"):
            result[key] = run.figures[key]
    return result, output


class FirstOutput:
    """Watches an output topic from before its system starts, until its first record is
    visible to a ``read_committed`` consumer: start-up as a user sees it, the first result out
    (a record's own timestamp will not do: quixstreams gives an output its input's)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        import threading

        config = consumer_config(bootstrap, profile=ConsumerProfile.REPLAY, read_committed=True)
        self.consumer = Consumer(config | {"fetch.wait.max.ms": 20})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="first-output", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while self.seen is None and not self._stop.is_set():
            message = self.consumer.poll(0.05)
            if message is not None and message.error() is None:
                self.seen = time.monotonic()

    def seconds_after(self, launched: float) -> float | None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()
        return None if self.seen is None else round(self.seen - launched, 2)


def scale_model(result: dict[str, Any], records: int) -> dict[str, Any]:
    """Amdahl's law from sparkpoint's CPU excluding start-up: the serial part is the driver's,
    what runs once per job whatever the executors (the agent's process, the driver JVM's
    threads, its JIT and collector); the parallel part what runs in executors (the Python
    workers and the JVM's executor threads); ``serial_fraction`` = serial / (serial + parallel).

    The coordinator is apart: a service of its own process that many jobs share, whose work
    (triggers, acknowledgements, completions, heartbeats) comes per checkpoint and per second,
    not per record or per round, and which no round waits for; ``serial_fraction_with_coordinator``
    counts it as serial too (its share of this one job's run).

    The exactly-once sink is a bound of its own: one process per job produces every epoch (one
    transaction per epoch; on a cluster one Spark task per epoch), overlapped with the rounds,
    so however many executors, records/s stay below what one core of it produces."""
    roles = result["cpu"]["by_role_excluding_startup"]
    parallel_roles = ("spark-python-workers", "jvm-executor")
    sink_roles = ("sink-writer",)
    apart_roles = ("coordinator",)
    parallel = sum(roles.get(role, 0.0) for role in parallel_roles)
    sink = sum(roles.get(role, 0.0) for role in sink_roles)
    coordinator = sum(roles.get(role, 0.0) for role in apart_roles)
    serial_roles = sorted(r for r in roles if r not in (*parallel_roles, *sink_roles, *apart_roles))
    serial = sum(roles[r] for r in serial_roles)
    fraction = serial / (serial + parallel)
    with_coordinator = (serial + coordinator) / (serial + coordinator + parallel)
    rounds = max(1, int(result["rounds"]))
    seconds = result["seconds_excluding_startup"]
    return {
        "serial_cpu_seconds_per_million_records": round(serial / records * 1e6, 3),
        "parallel_cpu_seconds_per_million_records": round(parallel / records * 1e6, 2),
        "serial_cpu_ms_per_round": round(serial / rounds * 1000, 1),
        "parallel_cpu_ms_per_round": round(parallel / rounds * 1000, 1),
        "records_per_round": round(records / rounds),
        "serial_roles": serial_roles,
        "parallel_roles": list(parallel_roles),
        "sink_roles": list(sink_roles),
        "apart_roles": list(apart_roles),
        "sink_cpu_seconds_per_million_records": round(sink / records * 1e6, 2),
        "sink_bound_records_per_second": round(records / sink) if sink else None,
        "coordinator_cpu_seconds_per_million_records": round(coordinator / records * 1e6, 3),
        "coordinator_cores_busy": round(coordinator / seconds, 3) if seconds else None,
        "serial_fraction": round(fraction, 4),
        "amdahl_speedup": {
            str(n): round(1 / (fraction + (1 - fraction) / n), 2) for n in EXECUTORS
        },
        "bound_if_overlapped": round(1 / fraction, 1),
        "serial_fraction_with_coordinator": round(with_coordinator, 4),
        "amdahl_speedup_with_coordinator": {
            str(n): round(1 / (with_coordinator + (1 - with_coordinator) / n), 2) for n in EXECUTORS
        },
        "assumptions": "executors do the same work per record as local[2]'s Python workers; "
        "resident tasks only on a local master: on a cluster every round is a Spark job, as "
        "sparkpoint-jobs measures; "
        "the driver's work per round does not grow with executors (it does: a round has one "
        "task per subtask); the broker scales apart; rounds as long as here; the sink is "
        "one process per job (sink_bound_records_per_second: one core of it); the coordinator "
        "runs apart (its own process or machine, shared by jobs)",
    }


def less_the_cost_of_running(result: dict[str, Any], idle: dict[str, Any]) -> dict[str, Any]:
    """The scale model without the driver's cost of running: the serial part less what the
    driver spends per second besides its job's loop with nothing to process (the idle run's
    cores busy in the serial roles, less its loop thread's, over this run's seconds): the
    control link, heartbeats, librdkafka's threads, the driver JVM's. Such a cost is not serial
    work as Amdahl's law has it (a faster cluster spends it over a shorter run), and on two cores
    a run's length and its rounds do not change, so this run alone cannot tell it from the
    driver's work per round.

    The loop's own CPU stays serial whole: it plans, hands out and collects the rounds, but idle
    it also looks for new input every 50 ms (a list of offsets each time), which a busy loop
    does once a round; counted as a cost of running, that polling took off more than a busy
    driver spends on it (the first version of this estimate took off the idle loop too). What
    is left estimates the driver's work for the rounds, their records and the checkpoints'
    handling in the loop, as long as its other threads cost per second running what they cost
    idle."""
    model = result["scale_model"]
    roles = result["cpu"]["by_role_excluding_startup"]
    seconds = result["seconds_excluding_startup"]
    busy = idle["cores_busy_by_role"]
    serial = sum(roles.get(role, 0.0) for role in model["serial_roles"])
    driver = sum(busy.get(role, 0.0) for role in model["serial_roles"])
    per_second = max(0.0, driver - idle["loop_cores_busy"])
    parallel = sum(roles.get(role, 0.0) for role in model["parallel_roles"])
    left = max(0.0, serial - per_second * seconds)
    fraction = left / (left + parallel)
    loop = result.get("loop_cpu_seconds")
    return {
        "driver_cores_busy_idle": round(driver, 4),
        "loop_cores_busy_idle": idle["loop_cores_busy"],
        "driver_cores_busy_idle_besides_the_loop": round(per_second, 4),
        "loop_cpu_seconds": loop,
        "loop_cpu_ms_per_round": round(loop / max(1, int(result["rounds"])) * 1000, 1)
        if loop is not None
        else None,
        "serial_cpu_seconds_less_the_cost_of_running": round(left, 3),
        "serial_fraction_less_the_cost_of_running": round(fraction, 4),
        "amdahl_speedup_less_the_cost_of_running": {
            str(n): round(1 / (fraction + (1 - fraction) / n), 2) for n in EXECUTORS
        },
        "less_the_cost_of_running_as": "the serial CPU less, over this run's seconds "
        "(excluding start-up), what the driver's threads besides the job's loop cost per second "
        "in the idle run (its cores busy in the serial roles less its loop thread's): the "
        "driver's work for the rounds, their records and the loop's handling of checkpoints, "
        "if those other threads cost per second running what they cost idle; the loop's CPU "
        "stays whole (idle it polls for input, which a busy loop does once a round); "
        "serial_fraction counts every cost",
    }


def beside_a_coordinator(bootstrap: str, root: Path, job: Callable[[], Run]) -> tuple[Run, TreeCpu]:
    """Runs a sparkpoint job (``job``) against a coordinator process of its own, whose CPU is
    sampled meanwhile; returns the run and those samples."""
    coordinator = CoordinatorProcess(bootstrap, root)
    coordinator_cpu = TreeCpu(coordinator.process.pid, lambda *_: "coordinator")
    try:
        return job(), coordinator_cpu
    finally:
        coordinator_cpu.stop()
        coordinator.stop()


def idle_rates(bootstrap: str, root: Path, timeout_s: float) -> dict[str, Any]:
    """sparkpoint's cost per second of running with nothing to process: the peers job on an
    empty topic that stays open (no round planned while nothing arrives, a checkpoint every
    second), measured over `IDLE_SECONDS` once its first checkpoints are behind it. CPU per
    second by role (cores busy), the job process's by its own clock, the others over the same
    span from their samples."""
    topic, output = "peers-idle-in", "peers-idle-out"
    create_topic(bootstrap, topic)
    create_topic(bootstrap, output)
    args = [
        "--bootstrap", bootstrap, "--input", topic, "--output", output, "--records", "0",
        "--work-dir", str(root / "checkpoints"), "--name", f"peers-idle-{uuid.uuid4().hex[:8]}",
        "--idle-seconds", str(IDLE_SECONDS),
    ]  # fmt: skip
    log = root / "sparkpoint-idle.log"
    run, coordinator_cpu = beside_a_coordinator(
        bootstrap, root,
        lambda: run_job(Path(sys.executable), "sparkpoint_job.py", args, log, timeout_s, dict(os.environ)),
    )  # fmt: skip
    since, until = run.figures["idle_from"], run.figures["idle_to"]
    seconds = until - since
    before, after = run.cpu.roles_at(since), run.cpu.roles_at(until)
    busy = {role: (after[role] - before.get(role, 0.0)) / seconds for role in after}
    busy["job-process"] = run.figures["process_cpu_seconds"] / seconds
    loop = run.figures["loop_cpu_seconds"] / seconds
    busy["coordinator"] = (coordinator_cpu.at(until) - coordinator_cpu.at(since)) / seconds
    return {
        "seconds": round(seconds, 2),
        "rounds": run.figures["rounds"],
        "cores_busy_by_role": {role: round(value, 4) for role, value in sorted(busy.items())},
        "loop_cores_busy": round(loop, 4),
        "measured_as": "the peers job on an empty topic that stays open (checkpoints every 1 s, "
        "unaligned, exactly-once sink), from 3 s after its first turn; the job process by "
        "its own clock (process_time) and its loop thread by that thread's, the others from "
        "/proc every 0.25 s over the same span",
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"{'system':<12} {'rec/s incl. start':>17} {'rec/s excl. start':>17} "
        f"{'start s':>8} {'ckpt p50 ms':>11} {'cpu-s/M':>8} {'cores':>6}  exact"
    ]
    for system, r in results.items():
        p50 = r.get("checkpoint_p50_ms")
        cpu = r["cpu"]
        lines.append(
            f"{system:<12} {r['records_per_second_including_startup']:>17,} "
            f"{r['records_per_second_excluding_startup']:>17,} {r['startup_seconds']:>8.1f} "
            f"{'-' if p50 is None else f'{p50:.0f}':>11} "
            f"{cpu['seconds_per_million_records_excluding_startup']:>8.1f} "
            f"{cpu['cores_busy_excluding_startup']:>6.2f}  {r['exact']}"
        )
    return "\n".join(lines)


def longer_run(bootstrap: str, root: Path, records: int, timeout_s: float) -> dict[str, Any]:
    """sparkpoint over ``records`` of the same workload on a topic of its own, checked exact,
    for the scale model (`LONGER_RECORDS`)."""
    data = workload(records)
    produce_input(bootstrap, "peers-longer-in", data)
    print(f"sparkpoint: a longer run for the scale model ({records:,} records)")
    # run 0: an output topic and a log apart from the interleaved runs' (1, 2, ...)
    result, output = run_system(
        "sparkpoint", bootstrap, "peers-longer-in", root, records, timeout_s, run_number=0
    )
    checked("sparkpoint", read_output(bootstrap, output), data, result)
    if result["exact"] is False:  # reported, as the interleaved runs' are (``exact``)
        print(f"sparkpoint longer: NOT exact: {result['check']}")
    print(
        f"sparkpoint longer: {result['records_per_second_excluding_startup']:,} records/s "
        f"excluding start-up, CPU s by role after start-up "
        f"{result['cpu']['by_role_excluding_startup']}"
    )
    return {"records": records} | result


def goals(
    results: dict[str, dict[str, Any]], longer: dict[str, Any] | None = None
) -> dict[str, Any]:
    ours = results["sparkpoint"]
    rate = ours["records_per_second_excluding_startup"]
    found: dict[str, Any] = {}
    for peer, goal in GOALS.items():
        if peer in results:
            theirs = results[peer]["records_per_second_excluding_startup"]
            found[f"sparkpoint_over_{peer}"] = {
                "measured": round(rate / theirs, 2),
                "goal": goal,
                "met": rate >= goal * theirs,
                "of": "records/s excluding start-up",
            }
            if peer in EARLIER_GOALS:
                found[f"sparkpoint_over_{peer}"] |= {
                    "earlier_goal": EARLIER_GOALS[peer],
                    "earlier_met": rate >= EARLIER_GOALS[peer] * theirs,
                }
    found["records_per_second"] = {
        "measured": rate,
        "goal": RATE_GOAL,
        "met": rate >= RATE_GOAL and ours["exact"],
        "of": "sparkpoint's records/s excluding start-up, exact",
    }
    p50 = ours["checkpoint_p50_ms"]
    found["checkpoint_p50_ms"] = {
        "measured": p50,
        "goal": CHECKPOINT_P50_GOAL_MS,
        "met": p50 is not None and p50 <= CHECKPOINT_P50_GOAL_MS,
    }
    if "hand-loop" in results:
        mine = ours["cpu"]["seconds_per_million_records_excluding_startup"]
        floor = results["hand-loop"]["cpu"]["seconds_per_million_records_excluding_startup"]
        found["cpu_seconds_per_million_over_hand_loop"] = {
            "measured": round(mine / floor, 2),
            "goal": 1.0,
            "met": mine <= floor,
            "of": "CPU-seconds per million records excluding start-up (at most the loop's)",
        }
    first = ours.get("first_processed_seconds")
    found["startup_to_first_processed_seconds"] = {
        "measured": first,
        "goal": STARTUP_GOAL_S,
        "met": first is not None and first <= STARTUP_GOAL_S,
        "of": "launching the agent's process to the end of its first round that processed records",
    }
    fraction = ours["scale_model"]["serial_fraction"]
    found["serial_fraction"] = {
        "measured": fraction,
        "goal": SERIAL_FRACTION_GOAL,
        "met": fraction <= SERIAL_FRACTION_GOAL,
        "predicted_speedup_at_32": ours["scale_model"]["amdahl_speedup"]["32"],
        "of": "the driver's CPU (agent process and driver JVM) against the executors', with "
        "resident tasks (a local master)",
        "with_the_coordinator_as_serial": ours["scale_model"]["serial_fraction_with_coordinator"],
        "predicted_speedup_at_32_with_the_coordinator_as_serial": ours["scale_model"][
            "amdahl_speedup_with_coordinator"
        ]["32"],
    }
    if "serial_fraction_less_the_cost_of_running" in ours["scale_model"]:
        left = ours["scale_model"]["serial_fraction_less_the_cost_of_running"]
        found["serial_fraction"] |= {
            "less_the_cost_of_running": left,
            "met_less_the_cost_of_running": left <= SERIAL_FRACTION_GOAL,
            "predicted_speedup_at_32_less_the_cost_of_running": ours["scale_model"][
                "amdahl_speedup_less_the_cost_of_running"
            ]["32"],
        }
    if longer is not None:
        model = longer["scale_model"]
        left = model["serial_fraction_less_the_cost_of_running"]
        found["serial_fraction"]["in_a_longer_run"] = {
            "records": longer["records"],
            "exact": longer["exact"],
            "measured": model["serial_fraction"],
            "met": model["serial_fraction"] <= SERIAL_FRACTION_GOAL,
            "predicted_speedup_at_32": model["amdahl_speedup"]["32"],
            "less_the_cost_of_running": left,
            "met_less_the_cost_of_running": left <= SERIAL_FRACTION_GOAL,
            "predicted_speedup_at_32_less_the_cost_of_running": model[
                "amdahl_speedup_less_the_cost_of_running"
            ]["32"],
        }
    if "sparkpoint-jobs" in results:  # executors of a cluster take a Spark job per round
        jobs = results["sparkpoint-jobs"]["scale_model"]
        found["serial_fraction"] |= {
            "with_a_spark_job_per_round": jobs["serial_fraction"],
            "predicted_speedup_at_32_with_a_spark_job_per_round": jobs["amdahl_speedup"]["32"],
            "met_with_a_spark_job_per_round": jobs["serial_fraction"] <= SERIAL_FRACTION_GOAL,
        }
    return found


REPEATS_AS = (
    "every system runs --repeat times, interleaved (each system once, then each again); a "
    "system's figures are those of its run with the median records/s excluding start-up (its "
    "CPU, checkpoints and scale model from that same run), and 'runs' lists every run's rate, "
    "start-up and exactness; a system is exact only if every run was; sparkpoint's start-up "
    "is the median of its runs'"
)


def median_run(found: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's figures over its runs: the run with the median records/s excluding start-up
    (the lower middle of an even count), with every run's rate, start-up and exactness beside
    (`REPEATS_AS`)."""
    ranked = sorted(found, key=lambda r: r["records_per_second_excluding_startup"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["runs"] = [
        {
            "records_per_second_excluding_startup": r["records_per_second_excluding_startup"],
            "startup_seconds": r["startup_seconds"],
            "first_processed_seconds": r.get("first_processed_seconds"),
            "checkpoint_p50_ms": r["checkpoint_p50_ms"],
            "exact": r["exact"],
        }
        for r in found
    ]
    exact = [r["exact"] for r in found]
    chosen["exact"] = None if None in exact else all(exact)
    firsts = sorted(
        r["first_processed_seconds"] for r in found if r.get("first_processed_seconds") is not None
    )
    if firsts:
        chosen["first_processed_seconds"] = firsts[(len(firsts) - 1) // 2]
    return chosen


def checked(system: str, output: pd.DataFrame, data: Workload, result: dict[str, Any]) -> None:
    """Puts the output's check in ``result``: every system's output in full, except
    spark-agg's (one sum per user and micro-batch, so only sums that are right, none twice and
    every user's last the total) and a partial run's (only sums that are right, none twice)."""
    found = check(output, data)
    if system == "spark-agg":
        found["one_output_per_record"] = False
        found["exact"] = (
            found["wrong"] == found["duplicates"] == found["users_with_wrong_last_sum"] == 0
        )
    if result.get("partial"):
        found = {
            "output_records": found["output_records"],
            "duplicates": found["duplicates"],
            "wrong": found["wrong"],
            "exact": None,
            "note": f"partial run: {result['records']:,} of {data.records:,} records consumed",
        }
    result["check"] = found
    result["exact"] = found["exact"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset, in this order"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per system")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of every system, interleaved (median kept)"
    )
    parser.add_argument(
        "--longer-records", type=int, default=LONGER_RECORDS,
        help="sparkpoint's longer run for the scale model (0: none)",
    )  # fmt: skip
    options = parser.parse_args()
    if options.repeat < 1:
        parser.error("--repeat must be at least 1")
    systems = [s for s in options.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")

    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-peers-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    data = workload(options.records)
    results: dict[str, dict[str, Any]] = {}
    with EmbeddedBroker() as broker:
        started = time.monotonic()
        produce_input(broker.bootstrap, "peers-in", data)
        print(f"wrote {data.records:,} records in {time.monotonic() - started:.1f} s")
        runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
        for number in range(1, options.repeat + 1):
            for system in systems:  # interleaved: a slower spell of the machine hits every system
                print(f"{system}: running ({number} of {options.repeat})")
                result, output = run_system(
                    system, broker.bootstrap, "peers-in", root, data.records, options.timeout,
                    number,
                )  # fmt: skip
                checked(system, read_output(broker.bootstrap, output), data, result)
                if result["exact"] is False:
                    print(f"{system}: NOT exact: {result['check']}")
                runs[system].append(result)
                print(
                    f"{system}: {result['seconds_including_startup']} s with start-up, "
                    f"{result['seconds_excluding_startup']} s without, exact {result['exact']}; "
                    f"CPU s by role after start-up {result['cpu']['by_role_excluding_startup']}, "
                    f"broker {result['cpu']['broker_seconds']} s; start-up "
                    f"{result['startup_seconds']} s, first record processed at "
                    f"{result.get('first_processed_seconds', result['startup_seconds'])} s, "
                    f"first output at {result['first_output_seconds']} s"
                )
        results = {system: median_run(found) for system, found in runs.items()}
        idle: dict[str, Any] | None = None
        if "sparkpoint" in results:
            print("sparkpoint: idle run (an empty topic, checkpoints every second)")
            idle = idle_rates(broker.bootstrap, root, options.timeout)
            print(f"sparkpoint idle, cores busy by role: {idle['cores_busy_by_role']}")
            results["sparkpoint"]["scale_model"] |= less_the_cost_of_running(
                results["sparkpoint"], idle
            )
        longer: dict[str, Any] | None = None
        if "sparkpoint" in results and options.longer_records > 0:
            longer = longer_run(broker.bootstrap, root, options.longer_records, options.timeout)
            assert idle is not None
            longer["scale_model"] |= less_the_cost_of_running(longer, idle)
    print(table(results))
    if options.keep:
        print(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    summary = {
        "benchmark": "peers",
        "workload": {
            "records": data.records,
            "partitions": PARTITIONS,
            "keys": USERS,
            "seed": SEED,
            "input": '{"user": "u<k>", "amount": 1..1000} keyed by user',
            "output": '{"user", "sum"} keyed by user, one per input record',
        },
        "broker": "embedded (tansu), all systems one after another",
        "repeats": options.repeat,
        "repeats_as": REPEATS_AS,
        **results,
        "sparkpoint_idle": idle,
        "sparkpoint_longer": longer,
        "goals": goals(results, longer) if "sparkpoint" in results else {},
    }
    if summary["goals"]:
        print(f"goals: {json.dumps(summary['goals'])}")
    if "sparkpoint" in results:
        print(f"scale model: {json.dumps(results['sparkpoint']['scale_model'])}")
    if longer is not None:
        print(f"scale model of the longer run: {json.dumps(longer['scale_model'])}")
    if set(results) == set(SYSTEMS):
        print(f"wrote {write_results('peers', summary)}")
    else:
        print("not all systems ran: bench/results/peers.json left as it was")


if __name__ == "__main__":
    main()
