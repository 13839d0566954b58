"""End-to-end throughput of the example job: 1,000,000 payments through the agent on Spark
``local[2]``, exactly-once Kafka sink, checkpoints every 1 s, against a real coordinator on the
embedded broker. Writes bench/results/pipeline.json.

Figures:
- records/s: input records / seconds from the job's registration to FINISHED (bounded source,
  so the run includes the final checkpoint and the last sink commit);
- checkpoint end-to-end duration p50/p99 (trigger to completion, from the audit topic);
- restore time: an agent restoring the last checkpoint (key groups, source positions), from start
  to registration, with Spark already warm; and the same restore with parallelism 4.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from recording import percentiles, write_results

from services.agent.example import example_job, generate
from services.agent.runtime import Agent, AgentOptions
from services.agent.spark import spark_session
from services.common.avro import EventCodec
from services.common.broker import EmbeddedBroker, free_port
from services.common.events import CheckpointEventType, CheckpointLifecycleEvent
from services.common.kafka import make_admin, replay_topic
from services.common.settings import CheckpointConfig
from services.common.topics import CHECKPOINT_EVENTS, create_topics
from services.coordinator.main import serve
from services.coordinator.service import CoordinatorService, ServiceSettings

RECORDS = 1_000_000
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}


def main() -> None:
    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-pipeline-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        create_topics(make_admin(bootstrap), partitions=6)
        defaults = CheckpointConfig(
            checkpoint_dir=str(root / "checkpoints"), savepoint_dir=str(root / "savepoints")
        )
        service = CoordinatorService(ServiceSettings(bootstrap, defaults))
        threading.Thread(
            target=lambda: asyncio.run(serve(service, "127.0.0.1", free_port())), daemon=True
        ).start()
        service.ready.wait(30)

        started = time.monotonic()
        generate(bootstrap, "payments", RECORDS)
        print(f"generated {RECORDS:,} payments in {time.monotonic() - started:.1f} s")
        spark = spark_session("sparkpoint-bench", "local[2]")

        job = example_job("bench-pipeline", bounded=True, settings=SETTINGS)
        options = AgentOptions(bootstrap, checkpoint_dir=str(root / "checkpoints"))
        agent = Agent(job, options, codec, spark=spark)
        started = time.monotonic()
        status = agent.run()
        elapsed = time.monotonic() - started - agent.start_seconds
        rate = RECORDS / elapsed
        print(f"{status.name}: {RECORDS:,} records in {elapsed:.1f} s = {rate:,.0f} records/s")

        durations = [
            e.duration_ms
            for r in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS)
            if isinstance(e := r.event, CheckpointLifecycleEvent)
            and e.job_id == job.id
            and e.event_type is CheckpointEventType.COMPLETED
            and e.duration_ms is not None
        ]
        checkpoints = percentiles(durations)
        print(f"checkpoints: {checkpoints}")

        restores = {}
        for parallelism in (2, 4):
            again = Agent(
                job,
                AgentOptions(
                    bootstrap, restore="latest", parallelism=parallelism,
                    checkpoint_dir=str(root / "checkpoints"),
                ),
                codec,
                spark=spark,
            )  # fmt: skip
            again.run()
            restores[f"parallelism_{parallelism}_s"] = round(again.start_seconds, 2)
        print(f"restore (start to registration, Spark warm): {restores}")
        service.stop()
    shutil.rmtree(root, ignore_errors=True)
    results = {
        "benchmark": "pipeline",
        "records": RECORDS,
        "master": "local[2]",
        "checkpoint_interval_ms": 1000,
        "sink": "Kafka, exactly-once",
        "records_per_second": round(rate),
        "seconds": round(elapsed, 1),
        "checkpoint_end_to_end_ms": checkpoints,
        "restore_seconds": restores,
    }
    path = write_results("pipeline", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
