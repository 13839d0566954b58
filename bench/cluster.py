"""Beyond one machine, measured in one run: the example job (exactly-once Kafka sink, checkpoints
every 1 s, bounded input) on Spark ``local[2]`` against a standalone cluster of two one-core
workers started from the pyspark package, each with its checkpoints on local disk and on S3
(moto's server through s3fs). Writes bench/results/cluster.json.

Figures per configuration:
- records/s (registration to FINISHED) and checkpoint end-to-end p50/p99;
- snapshot MB/s: the largest completed checkpoint's state size over its end-to-end duration
  (state files are incremental: a checkpoint writes only the key groups that changed, so this is
  the pace at which a state of that size is made durable, not the bytes written);
- restore MB/s: the last checkpoint's state size over the time a new agent takes from start to
  registration when restoring it (Spark warm), and that time.

moto's server is a single Python process on the same two cores: S3 figures are a floor for what
a real object store gives, not an estimate of it.

``--records N`` runs a smaller input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from recording import percentiles, start_coordinator, write_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkpoint.agent.example import example_job, generate
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.agent.spark.standalone import StandaloneCluster
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent
from sparkpoint.common.kafka import replay_topic
from sparkpoint.common.topics import CHECKPOINT_EVENTS
from tests.s3_server import start_s3_server

RECORDS = 400_000
ACCOUNTS = 200_000
"""Many keys, so the state is large enough (tens of MB) for snapshot and restore MB/s to mean
something; the example job's own default of a few thousand accounts keeps well under 1 MB."""
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}
CLUSTER_SETTINGS = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "1g",
    "spark.cores.max": "2",
}
MB = 1024 * 1024


def completed(bootstrap: str, codec: EventCodec, job_id: str) -> list[CheckpointLifecycleEvent]:
    return [
        e
        for r in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS)
        if isinstance(e := r.event, CheckpointLifecycleEvent)
        and e.job_id == job_id
        and e.event_type is CheckpointEventType.COMPLETED
        and e.duration_ms
    ]


def measure(
    label: str, bootstrap: str, codec: EventCodec, spark: Any, storage: str, records: int,
    master: str,
) -> dict[str, Any]:  # fmt: skip
    job = example_job(f"bench-{label}-{uuid.uuid4().hex[:6]}", bounded=True, settings=SETTINGS)
    options = {"checkpoint_dir": f"{storage}/checkpoints", "master": master}
    agent = Agent(job, AgentOptions(bootstrap, **options), codec, spark=spark)  # type: ignore[arg-type]
    started = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - started - agent.start_seconds
    done = completed(bootstrap, codec, job.id)
    largest = max(done, key=lambda e: e.state_size_bytes or 0, default=None)
    again = Agent(job, AgentOptions(bootstrap, restore="latest", **options), codec, spark=spark)  # type: ignore[arg-type]
    again.run()
    state_mb = (done[-1].state_size_bytes or 0) / MB if done else 0.0
    figures = {
        "status": status.name,
        "records_per_second": round(records / elapsed),
        "checkpoint_end_to_end_ms": percentiles([e.duration_ms for e in done if e.duration_ms]),
        "largest_checkpoint": None
        if largest is None
        else {
            "state_mb": round((largest.state_size_bytes or 0) / MB, 2),
            "ms": largest.duration_ms,
        },
        "snapshot_mb_per_s": None
        if largest is None or not largest.duration_ms
        else round((largest.state_size_bytes or 0) / MB / (largest.duration_ms / 1000), 2),
        "state_mb": round(state_mb, 2),
        "restore_s": round(again.start_seconds, 2),
        "restore_mb_per_s": round(state_mb / again.start_seconds, 2)
        if again.start_seconds
        else None,
    }
    print(f"{label}: {figures}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    args = parser.parse_args()
    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-cluster-"))
    s3 = start_s3_server(root / "moto.log")
    os.environ.update(s3.environment())
    bucket = s3.bucket()
    results: dict[str, Any] = {"benchmark": "cluster", "records": args.records}
    try:
        with EmbeddedBroker() as broker:
            generate(broker.bootstrap, "payments", args.records, accounts=ACCOUNTS)
            for storage_name, storage in (("local_disk", str(root)), ("s3_moto", bucket)):
                os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
                service = start_coordinator(broker.bootstrap, storage, partitions=6)
                try:
                    spark = spark_session("sparkpoint-bench-local", "local[2]")
                    results[f"local2_{storage_name}"] = measure(
                        f"local2-{storage_name}", broker.bootstrap, codec, spark, storage,
                        args.records, "local[2]",
                    )  # fmt: skip
                    spark.stop()  # type: ignore[attr-defined]
                    with StandaloneCluster(workers=2, cores=1) as cluster:
                        spark = spark_session(
                            "sparkpoint-bench-cluster", cluster.master_url, CLUSTER_SETTINGS
                        )
                        results[f"standalone2_{storage_name}"] = measure(
                            f"standalone2-{storage_name}", broker.bootstrap, codec, spark, storage,
                            args.records, cluster.master_url,
                        )  # fmt: skip
                        spark.stop()  # type: ignore[attr-defined]
                finally:
                    service.stop()
    finally:
        s3.stop()
        shutil.rmtree(root, ignore_errors=True)
    path = write_results("cluster", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
