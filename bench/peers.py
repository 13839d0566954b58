"""sparkpoint against two Python stream processors with checkpoints, quixstreams and bytewax, on
one workload and one broker. Writes bench/results/peers.json.

The workload: a 4-partition topic of ``--records`` (1,000,000) JSON records
``{"user": "u<k>", "amount": <1..1000>}`` over 10,000 users (numpy's generator, seed 7), keyed
by user (Kafka's murmur2 partitioner); each system keeps a running sum per user and writes every
updated sum ``{"user", "sum"}``, keyed by user, to an output topic of its own: one output record
per input record. The three run one after another, each as a process of its own (the peers in
.venv-peers: quixstreams needs another confluent-kafka than sparkpoint pins), on the same
embedded broker (tansu); the last record of each input partition is written in a batch of its
own, so the broker's end offsets (right only for one-record last batches) are right for every
system. Settings per system, in the docstrings of bench/peers/*_job.py:

- sparkpoint: Spark ``local[2]``, parallelism 2, exactly-once Kafka sink, checkpoints every 1 s
  (min pause 0), against a coordinator running in this process;
- quixstreams: exactly-once, RocksDB state, commit interval 1 s;
- bytewax: SQLite recovery, snapshots (epochs) every 1 s, one worker (its default).

Figures per system:
- records/s including start-up: input records / seconds from launching the process to the end
  of the run (sparkpoint: the job FINISHED, after its final checkpoint and sink commit;
  quixstreams: ``Application.run`` returned after its last commit; bytewax: the dataflow ended);
- records/s excluding start-up: the same end, from the job's registration (sparkpoint, as
  bench/pipeline.py) or the first record processed (the peers);
- checkpoint p50 (ms): sparkpoint's trigger-to-completed duration from the audit topic; the
  peers' as their job scripts measure it (quixstreams: one ``Checkpoint.commit`` call; bytewax:
  an epoch's end at the input to the frontier row in SQLite that lets a resume skip it);
- exact: the whole output topic read back (to its true end offsets) holds exactly one record
  per input record, each the right running sum (none missing, duplicated or wrong), and the last
  sum of every user equals its total computed here in plain Python.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from recording import percentiles, start_coordinator, write_results

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
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
SYSTEMS = ("sparkpoint", "quixstreams", "bytewax")
PARTITIONS = 4
USERS = 10_000
SEED = 7
MAX_AMOUNT = 1_000
GOALS = {"bytewax": 5.0, "quixstreams": 15.0}
"""sparkpoint's records/s excluding start-up over each peer's, as targets."""
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
    "quixstreams": "one Checkpoint.commit call (patched with a timer): flush sinks, produce "
    "the state changelog, flush the producer, commit the transaction with the offsets, flush "
    "RocksDB; empty checkpoints are closed, not committed, and not counted",
    "bytewax": "bytewax reports no snapshot duration (its snapshot_duration_seconds metric "
    "times one snapshot() call of one key); measured per epoch: from the input closing it (the "
    "last source partition's snapshot() call) to the recovery partition's fronts table first "
    "showing a later frontier (the epoch a resume would start from), read every 5 ms by a "
    "process of its own",
}
SETTINGS = {
    "sparkpoint": {
        "master": "local[2]",
        "parallelism": 2,
        "checkpoint_interval_ms": 1000,
        "checkpoint_min_pause_ms": 0,
        "state": "keyed value state (int64), vectorized per key group",
        "sink": "KafkaSink, exactly-once",
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
}


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


@dataclass(frozen=True)
class Run:
    launched: float
    figures: dict[str, Any]


def run_job(
    python: Path, script: str, args: list[str], log: Path, timeout_s: float, env: dict[str, str]
) -> Run:
    """Runs a job script to its end; its figures are the JSON line it prints last."""
    command = [str(python), str(JOBS / script), *args]
    launched = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
        try:
            code = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{script} did not end within {timeout_s:.0f} s; log: {log}"
            ) from None
    lines = log.read_text().splitlines()
    figures = [line[len(RESULT_PREFIX) :] for line in lines if line.startswith(RESULT_PREFIX)]
    if code != 0 or not figures:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"{script} exited {code} without figures; log {log}:\n{tail}")
    return Run(launched, json.loads(figures[-1]))


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


def run_system(
    system: str, bootstrap: str, input_topic: str, root: Path, records: int, timeout_s: float
) -> tuple[dict[str, Any], str]:
    """Runs one system over the input; returns its figures and its output topic."""
    output = f"peers-{system}-out"
    create_topic(bootstrap, output)
    name = f"peers-{system}-{uuid.uuid4().hex[:8]}"
    # sparkpoint's checkpoints go where the coordinator allows them (its storage roots)
    work_dir = root / ("checkpoints" if system == "sparkpoint" else system)
    args = [
        "--bootstrap", bootstrap, "--input", input_topic, "--output", output,
        "--records", str(records), "--work-dir", str(work_dir), "--name", name,
    ]  # fmt: skip
    env = dict(os.environ)
    log = root / f"{system}.log"
    if system == "sparkpoint":
        service = start_coordinator(bootstrap, root)
        try:
            run = run_job(Path(sys.executable), "sparkpoint_job.py", args, log, timeout_s, env)
        finally:
            service.stop()
        durations = checkpoint_durations(bootstrap, run.figures["job_id"])
        start = run.figures["registered"]
    else:
        if not PEERS_PYTHON.exists():
            raise RuntimeError(
                f"{PEERS_PYTHON} is missing: python3.11 -m venv .venv-peers && "
                ".venv-peers/bin/python -m pip install -r bench/peers-requirements.txt"
            )
        run = run_job(PEERS_PYTHON, f"{system}_job.py", args, log, timeout_s, env)
        durations = [round(d) for d in run.figures["checkpoint_durations_ms"]]
        start = run.figures["first_record"]
    result = figures(system, run, start, durations, records)
    if system == "sparkpoint":
        result["restarts"] = run.figures["restarts"]
    if system == "quixstreams":
        result["seconds_to_last_commit"] = round(run.figures["last_commit_end"] - start, 2)
    if system == "bytewax":
        result["epochs"] = run.figures["epochs"]
    return result, output


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"{'system':<12} {'rec/s incl. start':>17} {'rec/s excl. start':>17} "
        f"{'start s':>8} {'ckpt p50 ms':>11}  exact"
    ]
    for system, r in results.items():
        p50 = r.get("checkpoint_p50_ms")
        lines.append(
            f"{system:<12} {r['records_per_second_including_startup']:>17,} "
            f"{r['records_per_second_excluding_startup']:>17,} {r['startup_seconds']:>8.1f} "
            f"{'-' if p50 is None else f'{p50:.0f}':>11}  {r['exact']}"
        )
    return "\n".join(lines)


def goals(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ours = results["sparkpoint"]["records_per_second_excluding_startup"]
    return {
        f"sparkpoint_over_{peer}": {
            "measured": round(ours / results[peer]["records_per_second_excluding_startup"], 2),
            "goal": goal,
            "met": ours >= goal * results[peer]["records_per_second_excluding_startup"],
            "of": "records/s excluding start-up",
        }
        for peer, goal in GOALS.items()
        if peer in results
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated subset, in this order"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per system")
    options = parser.parse_args()
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
        for system in systems:
            print(f"{system}: running")
            result, output = run_system(
                system, broker.bootstrap, "peers-in", root, data.records, options.timeout
            )
            result["check"] = check(read_output(broker.bootstrap, output), data)
            result["exact"] = result["check"]["exact"]
            if not result["exact"]:
                print(f"{system}: NOT exact: {result['check']}")
            results[system] = result
            print(
                f"{system}: {result['seconds_including_startup']} s with start-up, "
                f"{result['seconds_excluding_startup']} s without, exact {result['exact']}"
            )
    print(table(results))
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
        **results,
        "goals": goals(results) if "sparkpoint" in results else {},
    }
    if summary["goals"]:
        print(f"goals: {json.dumps(summary['goals'])}")
    if set(results) == set(SYSTEMS):
        print(f"wrote {write_results('peers', summary)}")
    else:
        print("not all systems ran: bench/results/peers.json left as it was")


if __name__ == "__main__":
    main()
