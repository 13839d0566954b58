"""Time: event-time timers and windows at scale (issue 41), on Spark ``local[2]``, exactly-once
Kafka sink, 1 s checkpoints, against a real coordinator on the embedded broker. Writes
bench/results/time.json.

Runs:
- ``timers``: KEYS keys, each of TIMERS_PER_KEY records registering one event-time timer an
  hour after its record (1,000,000 pending timers at the end of the input by default); the
  bounded input's final watermark then fires them all. Figures: checkpoint end-to-end p50/p99
  while timers pile up (goal: p99 <= 1 s with 1,000,000 pending), timers fired per second (from
  the first fired to the last, sampled on the agent every 50 ms), and that over the cores
  Spark had (2).
- ``windowed`` against ``running_sum``: the same payments (``--records``, 1,000,000 by default)
  through a 10 s tumbling window (count and sum per account, `WindowAggregate`) and through a
  running sum per account (value state), each run alone. Goal: windowed >= 0.8x running sum.

- ``timers_unaligned``: the same with unaligned checkpoints. Timers fire inside a round, and an
  unaligned checkpoint does not wait for the round in flight (it holds the state from before
  it and the round's records as channel state): what Flink's
  ``unaligned.interruptible-timers.enabled`` gives, always on here. Figures: the checkpoints
  whose trigger-to-completion overlapped a round that fired timers, aligned and unaligned
  (goal: unaligned <= 200 ms during a burst of 1,000,000 firing timers).

Not here yet: bytewax's and quixstreams' windows on the same input (issue 41 goes on).

``--keys``, ``--timers-per-key`` and ``--records`` run smaller inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from confluent_kafka import Producer
from pipeline import checkpoint_durations
from recording import start_coordinator, write_results

from sparkpoint.agent.example import ensure_topic, generate
from sparkpoint.agent.job import (
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
)
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.agent.time.strategy import WatermarkStrategy
from sparkpoint.agent.time.windows import TumblingEventTimeWindows, WindowAggregate
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent
from sparkpoint.common.kafka import producer_config, replay_topic
from sparkpoint.common.topics import CHECKPOINT_EVENTS

SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
}
HOUR_MS = 3_600_000
START_MS = 1_767_225_600_000


class HourLater(KeyedFunction):
    """Each record registers a timer an hour after its event time; a fired timer emits one
    row."""

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        due = pd.Series(records["ts"].to_numpy() + HOUR_MS, index=records["key"].to_numpy())
        state.register_event_time_timers(due)
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        return pd.DataFrame({"key": timers["key"], "fired": timers["timestamp"]})


class RunningSum(KeyedFunction):
    """bench/latency_job.py's running sum on the payments' accounts: each record's running
    sum of its account."""

    state: ClassVar[dict[str, StateDescriptor]] = {"sum": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        account = records["account"]
        base = account.map(state.value("sum")).fillna(0).astype("int64")
        sums = base + records.groupby("account", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("sum", sums.groupby(account, sort=False).last())
        return pd.DataFrame({"account": account, "sum": sums})


def fill_timers(bootstrap: str, topic: str, keys: int, per_key: int) -> int:
    """``keys * per_key`` records, key k's j-th at START + (j * keys + k) ms: event time rises
    within every partition."""
    ensure_topic(bootstrap, topic)
    producer = Producer(producer_config(bootstrap) | {"linger.ms": 50})
    n = 0
    for j in range(per_key):
        for k in range(keys):
            value = json.dumps({"key": f"k{k:07d}", "ts": START_MS + j * keys + k}).encode()
            while True:
                try:
                    producer.produce(topic, value, partition=k % 4)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        producer.poll(0)
    producer.flush(60)
    return n


def agent_for(job: Job, bootstrap: str, root: Path, codec: EventCodec, spark: Any) -> Agent:
    return Agent(
        job, AgentOptions(bootstrap, checkpoint_dir=str(root / "checkpoints")), codec, spark=spark
    )


def during_bursts(
    bootstrap: str, codec: EventCodec, job_id: str, spans: list[tuple[int, int]]
) -> list[dict[str, int]]:
    """The completed checkpoints whose trigger-to-completion overlapped a round that fired
    timers: their ids and durations (ms)."""
    found = []
    for record in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS):
        event = record.event
        if (
            isinstance(event, CheckpointLifecycleEvent)
            and event.job_id == job_id
            and event.event_type is CheckpointEventType.COMPLETED
            and event.duration_ms is not None
        ):
            started = event.timestamp - event.duration_ms
            if any(started < end and event.timestamp > begin for begin, end in spans):
                found.append({"id": event.checkpoint_id, "duration_ms": event.duration_ms})
    return found


def timers_run(
    bootstrap: str, root: Path, codec: EventCodec, spark: Any, keys: int, per_key: int,
    unaligned: bool = False,
) -> dict[str, Any]:  # fmt: skip
    topic = f"bench-time-{uuid.uuid4().hex[:6]}"
    records = fill_timers(bootstrap, topic, keys, per_key)
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    job = Job(
        name=f"time-timers-{uuid.uuid4().hex[:6]}",
        source=KafkaSource([topic], bounded=True, watermark_strategy=strategy),
        key="key",
        function=HourLater(),
        sink=KafkaSink(f"{topic}-out"),
        settings={**SETTINGS, "execution.checkpointing.unaligned.enabled": str(unaligned).lower()},
    )
    agent = agent_for(job, bootstrap, root, codec, spark)
    started = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - started - agent.start_seconds
    fired = agent.stages.timers_fired
    firing_s = agent.stages.firing_seconds
    per_second = round(fired / firing_s) if firing_s else None
    bursts = during_bursts(bootstrap, codec, job.id, agent.stages.firing_spans)
    figures = {
        "status": status.name,
        "checkpoints": "unaligned" if unaligned else "aligned",
        "keys": keys,
        "records": records,
        "pending_timers_at_end_of_input": records,
        "timers_fired": fired,
        "seconds": round(elapsed, 1),
        "firing_seconds": round(firing_s, 2) if firing_s is not None else None,
        "timers_fired_per_second": per_second,
        "timers_fired_per_second_per_core": round(per_second / 2) if per_second else None,
        "checkpoint_end_to_end_ms": checkpoint_durations(bootstrap, codec, job.id),
        "checkpoints_during_firing": bursts,
        "checkpoint_during_firing_max_ms": max((b["duration_ms"] for b in bursts), default=None),
        "note": (
            "firing_seconds: the wall time of the rounds that fired timers, submission to "
            "collection (a round also processes records and writes its state); the final "
            "watermark fires every pending timer"
        ),
    }
    print(
        f"timers: {fired:,} fired of {records:,} in {firing_s} s = {per_second} /s; "
        f"checkpoints {figures['checkpoint_end_to_end_ms']}"
    )
    return figures


def throughput_run(
    name: str, function: KeyedFunction, topic: str, records: int, bootstrap: str, root: Path,
    codec: EventCodec, spark: Any,
) -> dict[str, Any]:  # fmt: skip
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    job = Job(
        name=f"time-{name}-{uuid.uuid4().hex[:6]}",
        source=KafkaSource([topic], bounded=True, watermark_strategy=strategy),
        key="account",
        function=function,
        sink=KafkaSink(f"{topic}-{name}"),
        settings=SETTINGS,
    )
    agent = agent_for(job, bootstrap, root, codec, spark)
    started = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - started - agent.start_seconds
    figures = {
        "status": status.name,
        "records_per_second": round(records / elapsed),
        "seconds": round(elapsed, 1),
        "checkpoint_end_to_end_ms": checkpoint_durations(bootstrap, codec, job.id),
    }
    print(f"{name}: {figures['records_per_second']:,} records/s, {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--timers-per-key", type=int, default=10)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-time-"))
    codec = EventCodec()
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    results: dict[str, Any] = {"benchmark": "time", "master": "local[2]", "parallelism": 2}
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        service = start_coordinator(bootstrap, root)
        spark = spark_session("sparkpoint-bench-time", "local[2]")
        try:
            results["timers"] = timers_run(
                bootstrap, root, codec, spark, args.keys, args.timers_per_key
            )
            results["timers_unaligned"] = timers_run(
                bootstrap, root, codec, spark, args.keys, args.timers_per_key, unaligned=True
            )
            topic = f"bench-time-payments-{uuid.uuid4().hex[:6]}"
            generate(bootstrap, topic, args.records)
            windows = WindowAggregate(
                TumblingEventTimeWindows.of("10s"),
                {"n": ("*", "count"), "total": ("amount", "sum")},
                timestamp_column="ts",
            )
            results["windowed"] = throughput_run(
                "windowed", windows, topic, args.records, bootstrap, root, codec, spark
            )
            results["running_sum"] = throughput_run(
                "running-sum", RunningSum(), topic, args.records, bootstrap, root, codec, spark
            )
        finally:
            spark.stop()
            service.stop()
            shutil.rmtree(root, ignore_errors=True)
    windowed = results["windowed"]["records_per_second"]
    running = results["running_sum"]["records_per_second"]
    timers = results["timers"]
    results["goals"] = {
        "windowed_over_running_sum": round(windowed / running, 2),
        "windowed_over_running_sum_goal": 0.8,
        "checkpoint_p99_ms_with_pending_timers": timers["checkpoint_end_to_end_ms"].get("p99"),
        "checkpoint_p99_goal_ms": 1000,
        "pending_timers": timers["pending_timers_at_end_of_input"],
        "unaligned_checkpoint_during_firing_max_ms": results["timers_unaligned"][
            "checkpoint_during_firing_max_ms"
        ],
        "unaligned_checkpoint_during_firing_goal_ms": 200,
        "aligned_checkpoint_during_firing_max_ms": timers["checkpoint_during_firing_max_ms"],
    }
    print(json.dumps(results["goals"], indent=1))
    write_results("time", results)


if __name__ == "__main__":
    main()
