"""End-to-end throughput of the example job: 1,000,000 payments through the agent on Spark
``local[2]``, exactly-once Kafka sink, checkpoints every 1 s, against a real coordinator on the
embedded broker; then the same job on a Spark standalone cluster started from the pyspark
package, with 1 worker and with 2 workers of 1 core each. Writes bench/results/pipeline.json.

Figures:
- records/s: input records / seconds from the job's registration to FINISHED (bounded source,
  so the run includes the final checkpoint and the last sink commit);
- checkpoint end-to-end duration p50/p99 (trigger to completion, from the audit topic);
- driver bytes per input byte: what the driver shipped to Spark tasks (pickled) plus what the
  tasks sent back (Spark's own ``resultSize`` task metric), over the input's value bytes;
- the fixed cost of one round: a Spark job of no-op tasks on the warm session (median of 20),
  what every round pays whatever it carries; and the rounds run (their stage-1 and stage-2
  parts);
- restore time: an agent restoring the last checkpoint (key groups, source positions), from start
  to registration, with Spark already warm; and the same restore with parallelism 4;
- ``cluster_speedup_2_workers``: records/s with 2 workers over records/s with 1.

``--records N`` runs a smaller input; ``--skip-cluster`` only the local run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from recording import percentiles, start_coordinator, write_results

from sparkpoint.agent.example import example_job, generate
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.agent.spark.standalone import StandaloneCluster
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent
from sparkpoint.common.kafka import replay_topic
from sparkpoint.common.topics import CHECKPOINT_EVENTS

RECORDS = 1_000_000
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}
CLUSTER_SETTINGS = {"spark.executor.cores": "1", "spark.executor.memory": "1g"}


def round_fixed_cost_ms(spark: Any, parallelism: int = 2, rounds: int = 20) -> float:
    """Median wall time of a no-op Spark job of ``parallelism`` tasks (a round, both stages in
    one job, with nothing to carry)."""
    sc = spark.sparkContext
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        sc.parallelize(range(parallelism), parallelism).map(lambda x: x).collect()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def checkpoint_durations(bootstrap: str, codec: EventCodec, job_id: str) -> dict[str, float]:
    return percentiles(
        [
            e.duration_ms
            for r in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS)
            if isinstance(e := r.event, CheckpointLifecycleEvent)
            and e.job_id == job_id
            and e.event_type is CheckpointEventType.COMPLETED
            and e.duration_ms is not None
        ]
    )


def run_job(
    name: str,
    bootstrap: str,
    codec: EventCodec,
    spark: Any,
    root: Path,
    records: int,
    **options: Any,
) -> tuple[Agent, dict[str, Any]]:
    job = example_job(name, bounded=True, settings=SETTINGS)
    agent = Agent(
        job,
        AgentOptions(bootstrap, checkpoint_dir=str(root / "checkpoints"), **options),
        codec,
        spark=spark,
    )
    started = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - started - agent.start_seconds
    figures = {
        "status": status.name,
        "records_per_second": round(records / elapsed),
        "seconds": round(elapsed, 1),
        "checkpoint_end_to_end_ms": checkpoint_durations(bootstrap, codec, job.id),
        "driver_bytes_per_input_byte": round(agent.traffic.total / max(1, agent.input_bytes), 5),
        "driver_bytes": {
            "to_tasks": agent.traffic.to_tasks,
            "from_tasks": agent.traffic.from_tasks,
            "input": agent.input_bytes,
        },
        "rounds": {"stage1": agent.fetches, "stage2": agent.rounds},
        "stage_seconds": {k: round(v, 1) for k, v in agent.stage_seconds.items()},
    }
    print(
        f"{name}: {status.name}, {records:,} records in {elapsed:.1f} s = "
        f"{figures['records_per_second']:,} records/s; checkpoints p50 "
        f"{figures['checkpoint_end_to_end_ms'].get('p50')} ms; driver bytes per input byte "
        f"{figures['driver_bytes_per_input_byte']}; rounds {figures['rounds']}"
    )
    return agent, figures


def restore_seconds(
    job: Any, bootstrap: str, codec: EventCodec, spark: Any, root: Path
) -> dict[str, float]:
    """Start to registration (Spark warm) of an agent restoring ``job``'s latest checkpoint
    under ``root``, at parallelism 2 and rescaled to 4."""
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
    return restores


def on_cluster(
    workers: int, bootstrap: str, codec: EventCodec, root: Path, records: int
) -> dict[str, Any]:
    with StandaloneCluster(workers=workers, cores=1) as cluster:
        spark = spark_session(
            f"sparkpoint-bench-{workers}-workers",
            cluster.master_url,
            CLUSTER_SETTINGS | {"spark.cores.max": str(workers)},
        )
        try:
            fixed = round_fixed_cost_ms(spark)
            _, figures = run_job(
                f"bench-cluster-{workers}", bootstrap, codec, spark, root, records,
                master=cluster.master_url, parallelism=2,
            )  # fmt: skip
        finally:
            spark.stop()  # type: ignore[attr-defined]
    return {"workers": workers, "cores_per_worker": 1, "round_fixed_cost_ms": fixed, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--skip-cluster", action="store_true")
    args = parser.parse_args()
    records = args.records

    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-pipeline-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        service = start_coordinator(bootstrap, root, partitions=6)

        started = time.monotonic()
        generate(bootstrap, "payments", records)
        print(f"generated {records:,} payments in {time.monotonic() - started:.1f} s")
        spark = spark_session("sparkpoint-bench", "local[2]")
        fixed = round_fixed_cost_ms(spark)
        print(f"fixed cost of a round (a no-op Spark job, local[2]): {fixed} ms")

        agent, local = run_job("bench-pipeline", bootstrap, codec, spark, root, records)
        restores = restore_seconds(agent.job, bootstrap, codec, spark, root)
        print(f"restore (start to registration, Spark warm): {restores}")
        spark.stop()

        cluster: dict[str, Any] = {}
        if not args.skip_cluster:
            one = on_cluster(1, bootstrap, codec, root, records)
            two = on_cluster(2, bootstrap, codec, root, records)
            speedup = round(two["records_per_second"] / one["records_per_second"], 2)
            print(f"standalone cluster, 2 workers vs 1 (1 core each): {speedup}x")
            cluster = {
                "standalone_1_worker": one,
                "standalone_2_workers": two,
                "cluster_speedup_2_workers": speedup,
            }
        service.stop()
    shutil.rmtree(root, ignore_errors=True)
    results = {
        "benchmark": "pipeline",
        "records": records,
        "master": "local[2]",
        "checkpoint_interval_ms": 1000,
        "sink": "Kafka, exactly-once",
        "round_fixed_cost_ms": fixed,
        **local,
        "restore_seconds": restores,
        **cluster,
    }
    path = write_results("pipeline", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
