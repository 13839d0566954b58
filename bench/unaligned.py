"""Aligned vs unaligned checkpoints with a backlog held in the channels: the example job whose
stage 2 is throttled to a fixed rate while the source reads faster, so records queue in the
channels until backpressure holds them at about 30 s of processing. The same job runs aligned,
then unaligned (aligned-checkpoint timeout 0), each for a while, against a real coordinator on
the embedded broker and Spark ``local[3]`` (each round reads more than its throttled stage-2
parts take; the third slot runs the sink's tasks beside a round); then the ``make run`` demo's shape (2,000
payments/s, no throttle, checkpoints every 1 s, ``local[2]``) with unaligned on. As ``make run`` deploys them, the
coordinator and the demo's generator run as processes of their own, the agent in this one.
Writes bench/results/unaligned.json.

Figures per run: checkpoint end-to-end p50/p99 (trigger to completion, from the audit topic),
records/s processed, the backlog (queued rows, and seconds of processing at the measured rate),
and where a checkpoint's milliseconds go, as medians over its checkpoints, from the
acknowledgements: trigger delivery (trigger to the sources' acknowledgement, less their write),
alignment (the wait for the barrier; 0 when unaligned at once), the synchronous snapshot, the
asynchronous part (state copies and the channel-state write), and acknowledgement to completion
(delivery, the coordinator's ``_metadata`` write, its completion record).

Goals: unaligned p50 <= 50 ms and p99 <= 200 ms, at least 20x faster than aligned in
the same run, throughput within 10% of aligned; the demo shape with unaligned p50 <= 200 ms.

``--seconds N`` sets each throttled run's length (default 90).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from recording import CoordinatorProcess, percentiles, write_results

from sparkpoint.agent.example import PaymentStats, ensure_topic, example_job, generate
from sparkpoint.agent.job import KeyedState
from sparkpoint.agent.rounds.channels import DEFAULT_CAPACITY_BYTES
from sparkpoint.agent.runtime import MAX_ROWS_PER_ROUND, Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointEventType,
    CheckpointLifecycleEvent,
)
from sparkpoint.common.kafka import replay_topic
from sparkpoint.common.topics import ACKS, CHECKPOINT_EVENTS

ROWS_PER_SECOND = 4_000
"""Stage 2's throttled rate, over both subtasks."""
BACKLOG_S = 30
PARALLELISM = 2
ROWS_PER_ROUND = 1_000
"""Per subtask: a round takes half a second at the throttled rate."""
FETCH_RECORDS = 1_000
"""Per partition and fetch (6 partitions)."""
START_CAPACITY_BYTES = 256 * 1024
"""Until stage 2's rate is known: the first fetches queue little, the backlog grows from there."""
DEMO_RATE = 2_000
DEMO_SECONDS = 40
BASE = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.timeout": "10min",
}
UNALIGNED = {
    "execution.checkpointing.unaligned.enabled": "true",
    "execution.checkpointing.aligned-checkpoint-timeout": "0ms",
}


class Throttled(PaymentStats):
    """The example function at a fixed rate per subtask: it sleeps for its rows' share."""

    def __init__(self, rows_per_second: float) -> None:
        self.rows_per_second = rows_per_second

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(len(records) / self.rows_per_second)
        return super().process(records, state)


class Backlog:
    """Holds the channels at about ``BACKLOG_S`` seconds of processing: each round it samples the
    rows queued, and sets each channel's capacity (the backpressure threshold, in bytes) from
    the size of a queued row and the rate stage 2 has shown so far."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.started: float | None = None
        self.ready_ms: int | None = None
        """When the backlog first reached half its target: checkpoints from then on count."""

    def __call__(self, agent: Agent) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        rows = sum(s.rows for c in agent.channels for s in c.segments)
        size = sum(s.size for c in agent.channels for s in c.segments)
        self.samples.append(rows)
        elapsed = now - self.started
        if rows and agent.processed_rows and elapsed > 3:
            rate = agent.processed_rows / elapsed / PARALLELISM
            for channel in agent.channels:
                channel.capacity = max(1, int(BACKLOG_S * rate * size / rows))
            if self.ready_ms is None and rows / PARALLELISM >= BACKLOG_S * rate / 2:
                self.ready_ms = int(time.time() * 1000)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def breakdown(
    bootstrap: str, codec: EventCodec, job_id: str, since_ms: int, stopped_ms: int
) -> dict[str, Any]:
    """Per checkpoint completed once the backlog stood (``since_ms``), where its milliseconds
    went (medians over checkpoints); and the age of those still running when the job stopped
    (an aligned checkpoint may take longer than the run)."""
    triggered: dict[int, int] = {}
    completed: dict[int, tuple[int, int]] = {}
    for record in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS):
        event = record.event
        if not isinstance(event, CheckpointLifecycleEvent) or event.job_id != job_id:
            continue
        if event.event_type is CheckpointEventType.TRIGGERED:
            triggered[event.checkpoint_id] = event.timestamp
        elif event.event_type is CheckpointEventType.COMPLETED and event.duration_ms is not None:
            completed[event.checkpoint_id] = (event.timestamp, event.duration_ms)
    acks: dict[int, list[AcknowledgeCheckpoint]] = {}
    for record in replay_topic(bootstrap, codec, ACKS):
        event = record.event
        if isinstance(event, AcknowledgeCheckpoint) and event.job_id == job_id:
            acks.setdefault(event.checkpoint_id, []).append(event)
    parts: dict[str, list[float]] = {
        k: [] for k in ("delivery", "alignment", "sync", "async", "ack_to_completion")
    }
    durations, persisted, unaligned = [], [], 0
    unfinished = [
        stopped_ms - at for checkpoint_id, at in triggered.items() if checkpoint_id not in completed
    ]
    for checkpoint_id, (done_ms, duration_ms) in completed.items():
        if done_ms < since_ms:  # over before the backlog stood
            continue
        answers = acks.get(checkpoint_id, [])
        sources = [a for a in answers if a.subtask_id.startswith("source-")]
        keyed = [a for a in answers if a.subtask_id.startswith("keyed-")]
        if checkpoint_id not in triggered or not sources or not keyed:
            continue
        durations.append(duration_ms)
        start = triggered[checkpoint_id]
        first = min(sources, key=lambda a: a.ack_timestamp)
        parts["delivery"].append(max(0, first.ack_timestamp - start - first.sync_duration_ms))
        parts["alignment"].append(max(a.alignment_duration_ms for a in keyed))
        parts["sync"].append(max(a.sync_duration_ms for a in keyed))
        parts["async"].append(max(a.async_duration_ms for a in keyed))
        parts["ack_to_completion"].append(done_ms - max(a.ack_timestamp for a in answers))
        persisted.append(sum(a.persisted_data_bytes for a in keyed))
        unaligned += any(a.unaligned for a in keyed)
    return {
        "checkpoint_end_to_end_ms": percentiles(durations),
        "unfinished_at_stop_ms": sorted(unfinished),
        "milliseconds_median": {k: median(v) for k, v in parts.items()},
        "persisted_in_flight_bytes_median": median([float(p) for p in persisted]),
        "unaligned_checkpoints": unaligned,
    }


def run(
    name: str,
    topic: str,
    settings: dict[str, str],
    seconds: float,
    bootstrap: str,
    codec: EventCodec,
    spark: Any,
    root: Path,
    throttled: bool = True,
) -> dict[str, Any]:
    job = example_job(name, topic, f"{name}-out", bounded=False, settings=BASE | settings)
    if throttled:  # fetches of a second's worth: the backlog grows by them, up to the cap
        source = replace(job.source, max_records_per_partition=FETCH_RECORDS)
        job = replace(job, source=source, function=Throttled(ROWS_PER_SECOND / PARALLELISM))
    agent = Agent(
        job,
        AgentOptions(
            bootstrap,
            checkpoint_dir=str(root / "checkpoints"),
            parallelism=PARALLELISM,
            max_rows_per_round=ROWS_PER_ROUND if throttled else MAX_ROWS_PER_ROUND,
            capacity_bytes=START_CAPACITY_BYTES if throttled else DEFAULT_CAPACITY_BYTES,
        ),
        codec,
        spark=spark,
    )
    backlog = Backlog()
    if throttled:
        agent.on_round = backlog
    else:
        agent.on_round = lambda a: setattr(backlog, "started", backlog.started or time.monotonic())
    started_ms = int(time.time() * 1000)
    stopper = threading.Timer(seconds, agent.stop)
    stopper.start()
    status = agent.run()
    stopped_ms = int(time.time() * 1000)
    stopper.cancel()
    elapsed = time.monotonic() - (backlog.started or time.monotonic())
    rate = agent.processed_rows / elapsed if elapsed > 0 else 0.0
    queued = backlog.samples[len(backlog.samples) // 3 :]  # once the backlog built up
    figures: dict[str, Any] = {
        "status": status.name,
        "seconds": round(elapsed, 1),
        "records_processed": agent.processed_rows,
        "records_per_second": round(rate),
        "backlog_stood_after_s": (
            round((backlog.ready_ms - started_ms) / 1000, 1) if backlog.ready_ms else None
        ),
        **breakdown(bootstrap, codec, job.id, backlog.ready_ms or started_ms, stopped_ms),
    }
    if throttled:
        figures["backlog_rows_median"] = median([float(q) for q in queued])
        figures["backlog_seconds_median"] = (
            round(statistics.median(queued) / rate, 1) if queued and rate else None
        )
    e2e = figures["checkpoint_end_to_end_ms"]
    print(
        f"{name}: {figures['records_per_second']:,} records/s, {e2e.get('count', 0)} checkpoints, "
        f"p50 {e2e.get('p50')} ms, p99 {e2e.get('p99')} ms, unfinished at stop "
        f"{figures['unfinished_at_stop_ms']} ms, backlog "
        f"{figures.get('backlog_seconds_median')} s; where the ms go (median): "
        f"{figures['milliseconds_median']}"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90)
    args = parser.parse_args()
    seconds = args.seconds
    records = int(ROWS_PER_SECOND * (2 * seconds + 2 * BACKLOG_S) * 1.2)

    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-unaligned-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        service = CoordinatorProcess(bootstrap, root, partitions=6)
        started = time.monotonic()
        generate(bootstrap, "payments", records)
        print(f"generated {records:,} payments in {time.monotonic() - started:.1f} s")
        # each round reads more (FETCH_RECORDS per partition) than its throttled stage-2 parts
        # take (ROWS_PER_ROUND per subtask), so the backlog builds up as behind a slow keyed
        # function; the third slot runs the sink's and recovery's tasks beside a round
        spark = spark_session("sparkpoint-bench-unaligned", f"local[{PARALLELISM + 1}]")
        aligned = run("aligned", "payments", {}, seconds, bootstrap, codec, spark, root)
        unaligned = run("unaligned", "payments", UNALIGNED, seconds, bootstrap, codec, spark, root)
        spark.stop()
        spark = spark_session("sparkpoint-bench-unaligned-demo", f"local[{PARALLELISM}]")

        # the demo's generator, like its coordinator, is a process of its own
        ensure_topic(bootstrap, "demo-payments")
        feeder = subprocess.Popen(
            [
                sys.executable, "-m", "sparkpoint.cli", "generate", "--bootstrap", bootstrap,
                "--topic", "demo-payments", "--rate", str(DEMO_RATE),
                "--count", str(DEMO_RATE * (DEMO_SECONDS + 20)),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        demo = run(
            "demo-unaligned", "demo-payments", UNALIGNED, DEMO_SECONDS, bootstrap, codec, spark,
            root, throttled=False,
        )  # fmt: skip
        feeder.terminate()
        feeder.wait(30)
        spark.stop()
        service.stop()
    shutil.rmtree(root, ignore_errors=True)

    a, u = aligned["checkpoint_end_to_end_ms"], unaligned["checkpoint_end_to_end_ms"]
    # aligned checkpoints may outlast the run: then the youngest unfinished one is a lower bound
    aligned_p50 = a.get("p50") or min(aligned["unfinished_at_stop_ms"], default=None)
    speedup = round(aligned_p50 / max(1.0, u["p50"]), 1) if aligned_p50 and u else None
    throughput = (
        round(unaligned["records_per_second"] / aligned["records_per_second"], 3)
        if aligned["records_per_second"]
        else None
    )
    demo_p50 = demo["checkpoint_end_to_end_ms"].get("p50")
    goals = {
        "unaligned_p50_le_50_ms": bool(u) and u["p50"] <= 50,
        "unaligned_p99_le_200_ms": bool(u) and u["p99"] <= 200,
        "speedup_ge_20x": speedup is not None and speedup >= 20,
        "throughput_within_10_percent": throughput is not None and throughput >= 0.9,
        "demo_p50_le_200_ms": demo_p50 is not None and demo_p50 <= 200,
    }
    print(f"unaligned vs aligned p50: {speedup}x; throughput ratio {throughput}; goals {goals}")
    results = {
        "benchmark": "unaligned",
        "master": f"local[{PARALLELISM + 1}] (throttled runs), local[{PARALLELISM}] (demo shape)",
        "stage2_rows_per_second": ROWS_PER_SECOND,
        "target_backlog_seconds": BACKLOG_S,
        "checkpoint_interval_ms": 1000,
        "aligned": aligned,
        "unaligned": unaligned,
        "speedup_p50": speedup,
        "speedup_is_a_lower_bound": not a,
        "throughput_unaligned_over_aligned": throughput,
        "demo_shape_unaligned": {"rate_per_second": DEMO_RATE, **demo},
        "goals": goals,
    }
    path = write_results("unaligned", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
