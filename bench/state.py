"""Keyed state at scale: what a round and a checkpoint cost as the state grows. The running-sum
job (bench/latency_job.py's ``RunningSum``, the peers workload's function) over S keys on
``local[2]``, parallelism 2, exactly-once Kafka sink, 1 s checkpoints, incremental, against a
real coordinator on the embedded broker: first S records that put every key in state, then
``--updates`` records on uniformly random keys, all in one bounded topic (4 partitions).
Writes bench/results/state.json.

Figures per S:
- the update phase apart (what the goals are about): records/s from the round that read past
  the last preload record to FINISHED, and the checkpoints triggered after it: bytes uploaded
  p50/p99, end-to-end p50/p99, and uploaded over the floor of changed entries (the distinct
  keys updated between two checkpoints' source positions, each its key's bytes and an 8-byte
  sum, from the input topic read back after the run);
- records/s: input records / seconds from the job's registration to FINISHED (start-up left
  out, the final checkpoint and sink commit in);
- state bytes written per stage-2 part (the new key-group files), mean and total, and over the
  full state size (the last checkpoint's): near 1 when each round rewrites the state it
  touches, far below when writes follow changes;
- bytes each checkpoint uploaded (the acknowledgements' ``checkpointed_size_bytes``, summed
  over subtasks) p50/p99, and over the full state size;
- checkpoint end-to-end p50/p99 (trigger to completion, from the audit topic);
- restore (start to registration, Spark warm) from the job's last checkpoint at parallelism 2,
  and rescaled to 4;
- peak RSS of this process and everything it started (Spark's JVM and Python workers);
- space amplification: the bytes of the files the last checkpoint names over the bytes of the
  entries in state (runs not yet folded into bases hold older versions of keys).

Then Spark Structured Streaming on the same input topic, in the same Spark session
(bench/peers/spark_streaming.py: a Python streaming data source over confluent-kafka, RocksDB
state with changelog checkpointing, 1 s triggers, ``groupBy().agg()`` and
``transformWithStateInPandas``, each with a time limit); ``--no-spark-streaming`` leaves it out.

The backend keeps each key group's state as a base and runs of changes (agent/state/): a round
writes one run of what it changed per subtask, a checkpoint uploads each run once. The earlier
backend, which wrote every touched key group's whole state each round, measured at 10^6 keys
and 1,000,000 updates on this machine: 83,156 records/s, 12.9 MB written per stage-2 part,
13.3 / 19.1 MB uploaded per checkpoint p50 / p99, checkpoints p50 / p99 499 / 1,271 ms.
``--keys`` chooses the sizes (default 10,000, 1,000,000 and 10,000,000); ``--updates`` the
updates (default 2,000,000).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

# bench/peers/ holds the Spark Structured Streaming peer (bench/peers.py shadows the directory)
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import latency_job
import numpy as np
import spark_streaming
from confluent_kafka import Consumer, Producer, TopicPartition
from latency_job import RunningSum
from pipeline import checkpoint_durations, restore_seconds
from recording import (
    percentiles,
    process_tree,
    resident_bytes,
    start_coordinator,
    write_results,
)

from sparkpoint.agent.job import DeliveryGuarantee, Job, KafkaSink, KafkaSource
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointEventType,
    CheckpointLifecycleEvent,
)
from sparkpoint.common.kafka import (
    consumer_config,
    make_admin,
    producer_config,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import ACKS, CHECKPOINT_EVENTS

KEYS = (10_000, 1_000_000, 10_000_000)
EARLIER = {
    "backend": "key-group files, each touched key group written whole every round",
    "records_per_second": 83_156,
    "state_bytes_written_per_stage_2_part": 12_899_341,
    "checkpointed_bytes_p50_p99": [13_340_000, 19_050_000],
    "checkpoint_end_to_end_ms_p50_p99": [499, 1_271],
    "measured_at": "2026-11-27, this machine, the commit before state runs (bench/state.py)",
}
UPDATES = 2_000_000
SPARK_TIME_LIMIT_S = {"agg": 900.0, "tws": 120.0}
PARTITIONS = 4
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.incremental": "true",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}


def fill(
    bootstrap: str, topic: str, keys: int, updates: int, seed: int = 7
) -> tuple[int, dict[int, int]]:
    """Every key once, then ``updates`` records on uniformly random keys; returns the records
    and, per partition, the offset where the updates begin."""
    from confluent_kafka.admin import NewTopic

    admin = make_admin(bootstrap)  # referenced until the topic exists
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer(producer_config(bootstrap, client_id="bench-state") | {"linger.ms": 20})
    rng = np.random.default_rng(seed)
    chosen = np.concatenate([np.arange(keys), rng.integers(0, keys, updates)])
    amounts = rng.integers(1, 1000, len(chosen))
    boundary: dict[int, int] = {}
    for start in range(0, len(chosen), 100_000):
        batch = slice(start, start + 100_000)
        if start == keys or (start < keys < start + 100_000):  # the updates start here
            head = slice(start, keys)
            produce_all(producer, topic, chosen[head], amounts[head])
            boundary = partition_ends(bootstrap, topic)
            batch = slice(keys, start + 100_000)
        produce_all(producer, topic, chosen[batch], amounts[batch])
    if not boundary:
        boundary = partition_ends(bootstrap, topic)
    return len(chosen), boundary


def produce_all(producer: Producer, topic: str, keys: np.ndarray, amounts: np.ndarray) -> None:
    for key, amount in zip(keys, amounts, strict=True):
        user = f"u{key}"
        value = json.dumps({"user": user, "amount": int(amount)}).encode()
        while True:
            try:
                producer.produce(topic, value, user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def partition_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end (its true end: the embedded broker's watermark can be short)."""
    consumer = Consumer(consumer_config(bootstrap, client_id="bench-state-ends"))
    try:
        return {p: true_end_offset(consumer, topic, p) for p in range(PARTITIONS)}
    finally:
        consumer.close()


def keys_by_offset(bootstrap: str, topic: str) -> dict[int, np.ndarray]:
    """Per partition, the key (its number) of every record, by offset."""
    consumer = Consumer(consumer_config(bootstrap, client_id="bench-state-keys"))
    found: dict[int, np.ndarray] = {}
    try:
        for partition in range(PARTITIONS):
            end = true_end_offset(consumer, topic, partition)
            keys = np.zeros(end, dtype=np.int64)
            consumer.assign([TopicPartition(topic, partition, 0)])
            seen = 0
            while seen < end:
                for message in consumer.consume(10_000, 1.0):
                    if message.error() is None and (offset := message.offset() or 0) < end:
                        keys[offset] = int(message.key()[1:])
                        seen += 1
            found[partition] = keys
    finally:
        consumer.close()
    return found


@dataclass
class Phases:
    """Watches a run (the agent's ``on_round``): when reading passed the start of the updates,
    and the source positions of each completed checkpoint (read from its directory before a
    later one subsumes it)."""

    directory: Path
    topic: str
    boundary: dict[int, int]
    updates_from: float | None = None
    first_update_checkpoint: int | None = None
    positions: dict[int, dict[int, int]] = field(default_factory=dict)

    def __call__(self, agent: Agent) -> None:
        now = time.monotonic()
        positions = agent.source.positions
        if self.updates_from is None and all(
            positions.get((self.topic, p), 0) >= end for p, end in self.boundary.items()
        ):
            self.updates_from = now
            self.first_update_checkpoint = max(agent.completed_checkpoints, default=0) + 1
        for checkpoint in agent.completed_checkpoints[-3:]:
            if checkpoint not in self.positions:
                read = source_positions(self.directory / f"chk-{checkpoint}", self.topic)
                if read is not None:
                    self.positions[checkpoint] = read


def source_positions(directory: Path, topic: str) -> dict[int, int] | None:
    found: dict[int, int] = {}
    try:
        for path in directory.glob("source-*.json"):
            snapshot = json.loads(path.read_text())
            for partition, offset in snapshot["positions"].get(topic, {}).items():
                found[int(partition)] = int(offset)
    except (OSError, ValueError, KeyError):
        return None
    return found if len(found) == PARTITIONS else None


def changed_floor(
    positions: dict[int, dict[int, int]], keys: dict[int, np.ndarray]
) -> dict[int, int]:
    """Per checkpoint whose predecessor's positions are known: the bytes of the entries that
    changed since (distinct keys in the records between the two, each its key's UTF-8 bytes and
    an 8-byte sum): what a checkpoint that uploads only what changed cannot go below."""
    floors: dict[int, int] = {}
    ordered = sorted(positions)
    for before, after in pairwise(ordered):
        changed = np.unique(
            np.concatenate(
                [keys[p][positions[before][p] : positions[after][p]] for p in range(PARTITIONS)]
            )
        )
        if len(changed):
            floors[after] = entry_bytes(changed)
    return floors


def entry_bytes(keys: np.ndarray) -> int:
    """The bytes of the entries of ``keys`` (key numbers): "u" and the digits, and the sum."""
    digits = np.floor(np.log10(np.maximum(keys, 1))).astype(np.int64) + 1
    return int((digits + 1 + 8).sum())


@dataclass
class PeakRss:
    """The largest resident set of this process and its descendants, sampled every 0.5 s."""

    peak: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, resident_bytes(process_tree()))


def checkpoint_bytes(
    bootstrap: str, codec: EventCodec, job_id: str
) -> tuple[dict[int, int], dict[int, int]]:
    """Per checkpoint, summed over its subtasks' acknowledgements: the bytes it uploaded, and
    the full size of the state it references."""
    uploaded: dict[int, int] = {}
    full: dict[int, int] = {}
    for received in replay_topic(bootstrap, codec, ACKS):
        event = received.event
        if isinstance(event, AcknowledgeCheckpoint) and event.job_id == job_id:
            checkpoint = event.checkpoint_id
            uploaded[checkpoint] = uploaded.get(checkpoint, 0) + event.checkpointed_size_bytes
            full[checkpoint] = full.get(checkpoint, 0) + event.state_size_bytes
    return uploaded, full


def checkpoint_durations_by_id(bootstrap: str, codec: EventCodec, job_id: str) -> dict[int, int]:
    """Trigger to completion of each completed checkpoint, from the audit topic."""
    return {
        e.checkpoint_id: e.duration_ms
        for r in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS)
        if isinstance(e := r.event, CheckpointLifecycleEvent)
        and e.job_id == job_id
        and e.event_type is CheckpointEventType.COMPLETED
        and e.duration_ms is not None
    }


def run_size(
    keys: int, updates: int, bootstrap: str, codec: EventCodec, spark: Any, root: Path
) -> dict[str, Any]:
    name = f"bench-state-{keys}-{uuid.uuid4().hex[:6]}"
    topic = f"{name}-in"
    started = time.monotonic()
    records, boundary = fill(bootstrap, topic, keys, updates)
    print(f"{name}: {records:,} records written in {time.monotonic() - started:.1f} s")
    job = Job(
        name=name,
        source=KafkaSource([f"{name}-in"], bounded=True),
        key="user",
        function=RunningSum(),
        sink=KafkaSink(f"{name}-out", delivery_guarantee=DeliveryGuarantee.EXACTLY_ONCE),
        parallelism=2,
        settings=SETTINGS,
    )
    options = AgentOptions(bootstrap, checkpoint_dir=str(root / "checkpoints"))
    rss = PeakRss()
    agent = Agent(job, options, codec, spark=spark)
    phases = Phases(root / "checkpoints" / job.id, topic, boundary)
    agent.on_round = phases
    began = time.monotonic()
    status = agent.run()
    ended = time.monotonic()
    elapsed = ended - began - agent.start_seconds
    rss.stop.set()
    uploaded, full = checkpoint_bytes(bootstrap, codec, job.id)
    durations = checkpoint_durations_by_id(bootstrap, codec, job.id)
    first = phases.first_update_checkpoint or 0
    in_updates = [c for c in sorted(uploaded) if c >= first]
    update_seconds = ended - (phases.updates_from or began)
    floors = changed_floor(phases.positions, keys_by_offset(bootstrap, topic))
    ordered = sorted(phases.positions)
    over_floor = [
        sum(uploaded.get(c, 0) for c in range(before + 1, after + 1)) / floors[after]
        for before, after in pairwise(ordered)
        if after in floors and after >= first
    ]
    state_size = full[max(full)] if full else 0
    written = agent.stages.state_bytes_written
    per_part = written / max(1, agent.rounds)
    restores = restore_seconds(job, bootstrap, codec, spark, root)
    figures = {
        "keys": keys,
        "input_topic": topic,
        "records": records,
        "updates": updates,
        "status": status.name,
        "records_per_second": round(records / elapsed),
        "seconds": round(elapsed, 1),
        "update_phase": {
            "records_per_second": round(updates / update_seconds),
            "seconds": round(update_seconds, 1),
            "checkpoints": len(in_updates),
            "checkpointed_bytes": percentiles([uploaded[c] for c in in_updates]),
            "checkpoint_end_to_end_ms": percentiles(
                [durations[c] for c in in_updates if c in durations]
            ),
            "changed_entry_bytes_per_checkpoint": percentiles(
                [f for c, f in floors.items() if c >= first]
            ),
            "uploaded_over_changed": {k: round(v, 2) for k, v in percentiles(over_floor).items()},
        },
        "state_size_bytes": state_size,
        # the files the last checkpoint names over the entries they hold (each key's bytes and
        # an 8-byte sum): Flink's changelog backend trades this for cheap checkpoints
        "space_amplification": round(state_size / entry_bytes(np.arange(keys)), 2),
        "state_bytes_written": {
            "total": written,
            "per_stage_2_part": round(per_part),
            "stage_2_parts": agent.rounds,
            "per_part_over_state": round(per_part / max(1, state_size), 3),
        },
        "checkpointed_bytes": percentiles(list(uploaded.values())),
        "checkpointed_p50_over_state": round(
            percentiles(list(uploaded.values())).get("p50", 0) / max(1, state_size), 3
        ),
        "checkpoint_end_to_end_ms": checkpoint_durations(bootstrap, codec, job.id),
        "restore_s": restores,
        "peak_rss_bytes": rss.peak,
    }
    phase = figures["update_phase"]
    print(
        f"{name}: update phase {phase['records_per_second']:,} records/s; uploaded per checkpoint "
        f"p50/p99 {phase['checkpointed_bytes'].get('p50', 0) / 1e6:.2f}/"
        f"{phase['checkpointed_bytes'].get('p99', 0) / 1e6:.2f} MB, "
        f"{phase['uploaded_over_changed']}x the changed entries; checkpoints p50/p99 "
        f"{phase['checkpoint_end_to_end_ms'].get('p50')}/"
        f"{phase['checkpoint_end_to_end_ms'].get('p99')} ms"
    )
    print(
        f"{name}: {status.name}, {figures['records_per_second']:,} records/s; state "
        f"{state_size / 1e6:.1f} MB; written per stage-2 part {per_part / 1e6:.2f} MB "
        f"({figures['state_bytes_written']['per_part_over_state']}x the state); uploaded per checkpoint p50/p99 "
        f"{figures['checkpointed_bytes'].get('p50', 0) / 1e6:.2f}/"
        f"{figures['checkpointed_bytes'].get('p99', 0) / 1e6:.2f} MB; checkpoints p50/p99 "
        f"{figures['checkpoint_end_to_end_ms'].get('p50')}/"
        f"{figures['checkpoint_end_to_end_ms'].get('p99')} ms; restore {restores}; peak RSS "
        f"{rss.peak / 2**20:.0f} MiB"
    )
    return figures


def spark_streaming_runs(
    figures: dict[str, Any], bootstrap: str, spark: Any, root: Path
) -> dict[str, Any]:
    """Spark Structured Streaming on the same input topic (bench/peers/spark_streaming.py):
    ``groupBy().agg()`` and ``transformWithStateInPandas``, each with a time limit (the second
    does a few thousand records a second here: it reports the rate of what it did)."""
    import spark_streaming

    keys, found = figures["keys"], {}
    for query in spark_streaming.QUERIES:
        found[query] = spark_streaming.run(
            spark, bootstrap, figures["input_topic"], keys, figures["records"], query,
            root / f"spark-{keys}-{query}", SPARK_TIME_LIMIT_S[query],
        )  # fmt: skip
    ours = figures["update_phase"]
    agg = found["agg"]
    theirs = agg.get("records_per_second", {}).get("update_phase") or 0
    found["sparkpoint_over_agg_records_per_second"] = round(
        ours["records_per_second"] / max(1, theirs), 2
    )
    print(
        f"{keys:,} keys: sparkpoint {ours['records_per_second']:,} records/s, Spark "
        f"Structured Streaming agg {theirs:,} ({found['sparkpoint_over_agg_records_per_second']}x)"
    )
    return found


def goals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, from the update phases of the smallest and the largest S."""
    if len(runs) < 2:
        return {}
    small, large = runs[0], runs[-1]
    phase = large["update_phase"]
    ratio = phase["records_per_second"] / max(1, small["update_phase"]["records_per_second"])
    found = {
        "keys": [small["keys"], large["keys"]],
        "records_per_second_ratio": round(ratio, 2),
        "records_per_second_ratio_goal": 0.7,
        "uploaded_over_changed_p50_p99": [
            phase["uploaded_over_changed"].get("p50"),
            phase["uploaded_over_changed"].get("p99"),
        ],
        "uploaded_over_changed_goal": 3,
        "checkpoint_p99_ms": phase["checkpoint_end_to_end_ms"].get("p99"),
        "checkpoint_p99_goal_ms": 1000,
    }
    print(f"goals: {found}")
    return found


def main() -> None:
    from pyspark import cloudpickle

    # the job's function travels to the Python workers by value: bench/ is not on their path
    cloudpickle.register_pickle_by_value(latency_job)  # type: ignore[no-untyped-call]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", help="comma-separated key counts (default 10000,1000000)")
    parser.add_argument("--updates", type=int, default=UPDATES)
    parser.add_argument(
        "--no-spark-streaming", action="store_true", help="leave out Spark Structured Streaming"
    )
    args = parser.parse_args()
    sizes = [int(float(k)) for k in args.keys.split(",")] if args.keys else list(KEYS)

    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-state-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    runs = []
    with EmbeddedBroker() as broker:
        service = start_coordinator(broker.bootstrap, root, partitions=6)
        spark = spark_session("sparkpoint-bench-state", "local[2]", spark_streaming.spark_conf())
        for keys in sizes:
            figures = run_size(keys, args.updates, broker.bootstrap, codec, spark, root)
            if not args.no_spark_streaming:
                figures["spark_structured_streaming"] = spark_streaming_runs(
                    figures, broker.bootstrap, spark, root
                )
            runs.append(figures)
        spark.stop()
        service.stop()
    shutil.rmtree(root, ignore_errors=True)
    results = {
        "benchmark": "state",
        "backend": "per key group a base and runs of changes; a round writes one run of what it "
        "changed per subtask, a checkpoint uploads each run once",
        "earlier_backend_at_1000000_keys_1000000_updates": EARLIER,
        "master": "local[2]",
        "parallelism": 2,
        "checkpoint_interval_ms": 1000,
        "sink": "Kafka, exactly-once",
        "runs": runs,
        "goals": goals(runs),
    }
    if args.keys is None and args.updates == UPDATES:
        print(f"wrote {write_results('state', results)}")
    else:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
