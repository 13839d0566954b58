"""Keyed state at scale: what a round and a checkpoint cost as the state grows. The running-sum
job (bench/latency_job.py's ``RunningSum``, the peers workload's function) over S keys on
``local[2]``, parallelism 2, exactly-once Kafka sink, 1 s checkpoints, incremental, against a
real coordinator on the embedded broker: first S records that put every key in state, then
``--updates`` records on uniformly random keys, all in one bounded topic (4 partitions).
Writes bench/results/state.json.

Figures per S:
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
- peak RSS of this process and everything it started (Spark's JVM and Python workers).

The backend keeps each key group's state as a base and runs of changes (agent/state/): a round
writes one run of what it changed per subtask, a checkpoint uploads each run once. The earlier
backend, which wrote every touched key group's whole state each round, measured at 10^6 keys
and 1,000,000 updates on this machine: 83,156 records/s, 12.9 MB written per stage-2 part,
13.3 / 19.1 MB uploaded per checkpoint p50 / p99, checkpoints p50 / p99 499 / 1,271 ms.
``--keys`` chooses the sizes (default 10,000 and 1,000,000); ``--updates`` the updates
(default 2,000,000). Spark Structured Streaming on the same workload is not measured yet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import latency_job
import numpy as np
from confluent_kafka import Producer
from latency_job import RunningSum
from pipeline import checkpoint_durations, restore_seconds
from recording import percentiles, start_coordinator, write_results

from sparkpoint.agent.job import DeliveryGuarantee, Job, KafkaSink, KafkaSource
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import AcknowledgeCheckpoint
from sparkpoint.common.kafka import make_admin, producer_config, replay_topic
from sparkpoint.common.topics import ACKS

KEYS = (10_000, 1_000_000)
EARLIER = {
    "backend": "key-group files, each touched key group written whole every round",
    "records_per_second": 83_156,
    "state_bytes_written_per_stage_2_part": 12_899_341,
    "checkpointed_bytes_p50_p99": [13_340_000, 19_050_000],
    "checkpoint_end_to_end_ms_p50_p99": [499, 1_271],
    "measured_at": "2026-11-27, this machine, the commit before state runs (bench/state.py)",
}
UPDATES = 2_000_000
PARTITIONS = 4
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.incremental": "true",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}


def fill(bootstrap: str, topic: str, keys: int, updates: int, seed: int = 7) -> int:
    """Every key once, then ``updates`` records on uniformly random keys; returns the records."""
    from confluent_kafka.admin import NewTopic

    admin = make_admin(bootstrap)  # referenced until the topic exists
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer(producer_config(bootstrap, client_id="bench-state") | {"linger.ms": 20})
    rng = np.random.default_rng(seed)
    chosen = np.concatenate([np.arange(keys), rng.integers(0, keys, updates)])
    amounts = rng.integers(1, 1000, len(chosen))
    for start in range(0, len(chosen), 100_000):
        batch = slice(start, start + 100_000)
        for key, amount in zip(chosen[batch], amounts[batch], strict=True):
            user = f"u{key}"
            value = json.dumps({"user": user, "amount": int(amount)}).encode()
            while True:
                try:
                    producer.produce(topic, value, user.encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(120)
    return len(chosen)


@dataclass
class PeakRss:
    """The largest resident set of this process and its descendants, sampled every 0.5 s."""

    peak: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, sum(rss_pages(pid) for pid in tree(os.getpid())) * page)


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def rss_pages(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


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


def run_size(
    keys: int, updates: int, bootstrap: str, codec: EventCodec, spark: Any, root: Path
) -> dict[str, Any]:
    name = f"bench-state-{keys}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    records = fill(bootstrap, f"{name}-in", keys, updates)
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
    began = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - began - agent.start_seconds
    rss.stop.set()
    uploaded, full = checkpoint_bytes(bootstrap, codec, job.id)
    state_size = full[max(full)] if full else 0
    written = agent.stages.state_bytes_written
    per_part = written / max(1, agent.rounds)
    restores = restore_seconds(job, bootstrap, codec, spark, root)
    figures = {
        "keys": keys,
        "updates": updates,
        "status": status.name,
        "records_per_second": round(records / elapsed),
        "seconds": round(elapsed, 1),
        "state_size_bytes": state_size,
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


def main() -> None:
    from pyspark import cloudpickle

    # the job's function travels to the Python workers by value: bench/ is not on their path
    cloudpickle.register_pickle_by_value(latency_job)  # type: ignore[no-untyped-call]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", help="comma-separated key counts (default 10000,1000000)")
    parser.add_argument("--updates", type=int, default=UPDATES)
    args = parser.parse_args()
    sizes = [int(float(k)) for k in args.keys.split(",")] if args.keys else list(KEYS)

    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-state-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    runs = []
    with EmbeddedBroker() as broker:
        service = start_coordinator(broker.bootstrap, root, partitions=6)
        spark = spark_session("sparkpoint-bench-state", "local[2]")
        for keys in sizes:
            runs.append(run_size(keys, args.updates, broker.bootstrap, codec, spark, root))
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
    }
    if args.keys is None and args.updates == UPDATES:
        print(f"wrote {write_results('state', results)}")
    else:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
