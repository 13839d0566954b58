"""Failover inside the agent, and what at-least-once checkpoints save: writes
bench/results/failover.json.

1. **Failover**: the example job (exactly-once Kafka sink, checkpoints every 1 s) on Spark
   ``local[2]`` against a real coordinator on the embedded broker; 20 times, its keyed function
   raises (a flag file the benchmark lays down). The restart strategy restarts the job in the
   agent, from its latest checkpoint, Spark warm. Measured: from the failure to the end of the
   first round after the restart that processed records (p50/p99), with
   ``restart-strategy.type: fixed-delay`` and no delay (the restart itself; a strategy's backoff
   adds to it), and the output checked against the reference at the end. Also from the
   failure to the restarted job running (restored and registered): the rest is its first
   rounds (reading, then processing what they read).
2. **AT_LEAST_ONCE vs EXACTLY_ONCE**: the same job with a backlog in its channels (a source read
   faster than stage 2), 1 s checkpoints, once per mode in the same run: checkpoint end-to-end
   duration p50/p99 from the audit topic.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from recording import percentiles, start_coordinator, write_results

from sparkpoint.agent.example import PaymentStats, example_job, generate, payments, reference_output
from sparkpoint.agent.job import KafkaSink, KafkaSource, KeyedState
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent
from sparkpoint.common.kafka import replay_topic
from sparkpoint.common.topics import CHECKPOINT_EVENTS

RECORDS = 600_000
FAILURES = 20
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": "1000",
    "restart-strategy.fixed-delay.delay": "0ms",
}


class FailOnFlag(PaymentStats):
    """The example function; raises once each time the flag file appears (and removes it)."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def process(self, records, state: KeyedState):  # type: ignore[no-untyped-def]
        try:
            os.unlink(self.flag)
        except FileNotFoundError:
            return super().process(records, state)
        raise RuntimeError("injected failure")


def main() -> None:
    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-failover-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"f{uuid.uuid4().hex[:8]}."
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        service = start_coordinator(bootstrap, root, partitions=4)
        generate(bootstrap, "payments", RECORDS)
        spark = spark_session("sparkpoint-bench-failover", "local[2]")
        failover = failovers(bootstrap, codec, spark, root)
        modes = {
            mode: checkpoint_durations(bootstrap, codec, spark, root, mode)
            for mode in ("EXACTLY_ONCE", "AT_LEAST_ONCE")
        }
        service.stop()
    shutil.rmtree(root, ignore_errors=True)
    exact = modes["EXACTLY_ONCE"].get("p50") or 1
    results = {
        "benchmark": "failover",
        "master": "local[2]",
        "records": RECORDS,
        "failover": failover,
        "checkpoint_end_to_end_ms": modes,
        "at_least_once_p50_vs_exactly_once": round(
            (modes["AT_LEAST_ONCE"].get("p50") or 0) / exact, 3
        ),
    }
    print(results)
    print(f"wrote {write_results('failover', results)}")


@dataclass
class Injection:
    """Where the failure injection of `failovers` stands."""

    next_failure: float
    restarts: int = 0
    rows: int = 0
    armed: bool = False
    restarted: bool = False


def failovers(bootstrap: str, codec: EventCodec, spark: object, root: Path) -> dict[str, object]:
    flag = str(root / "fail-now")
    output = f"failover-out-{uuid.uuid4().hex[:6]}"
    job = example_job("bench-failover", "payments", output, bounded=True, settings=SETTINGS)
    job = replace(
        job,
        function=FailOnFlag(flag),
        source=KafkaSource(["payments"], bounded=True, max_records_per_partition=2_000),
    )
    agent = Agent(
        job, AgentOptions(bootstrap, checkpoint_dir=str(root / "checkpoints")), codec, spark=spark
    )
    latencies: list[int] = []
    restarts_ms: list[int] = []
    """From the failure to the restarted job's first loop (restored, registered, running)."""
    state = Injection(next_failure=time.monotonic() + 5)

    def watch(running: Agent) -> None:
        """Arms one failure at a time (the flag), and measures it once the restarted job has
        processed records again; the next is armed 2 s later."""
        now = time.monotonic()
        if running.restarts > state.restarts:  # the armed failure fired: restarted
            state.restarts, state.rows, state.restarted = (
                running.restarts,
                running.processed_rows,
                True,
            )
            restarts_ms.append(int(time.time() * 1000) - running.last_failure_ms)
            return
        if state.restarted and running.processed_rows > state.rows:
            latencies.append(int(time.time() * 1000) - running.last_failure_ms)
            state.restarted, state.armed, state.next_failure = False, False, now + 2
        if (
            not state.armed  # stays armed until the restarted job processed records
            and len(latencies) < FAILURES
            and now >= state.next_failure
        ):
            state.armed = True
            Path(flag).write_text("fail")

    agent.on_round = watch
    started = time.monotonic()
    status = agent.run()
    elapsed = time.monotonic() - started
    got = Counter(read_sink(bootstrap, output))
    want = Counter(reference_output(payments(RECORDS), end_of_input=True))
    figures = {
        "failures": len(latencies),
        "restarts": agent.restarts,
        "restart_strategy": "fixed-delay, 0 ms delay",
        "failure_to_first_processed_ms": percentiles(latencies),
        "failure_to_running_ms": percentiles(restarts_ms),
        "status": status.name,
        "seconds": round(elapsed, 1),
        "exact": got == want,
    }
    print(f"failover: {figures}")
    return figures


def checkpoint_durations(
    bootstrap: str, codec: EventCodec, spark: object, root: Path, mode: str
) -> dict[str, float]:
    name = f"bench-mode-{mode.lower()}"
    settings = {**SETTINGS, "execution.checkpointing.mode": mode}
    job = example_job(name, "payments", f"{name}-out", bounded=True, settings=settings)
    # stage 1 reads far ahead of stage 2: a backlog an aligned checkpoint has to drain
    job = replace(
        job,
        source=KafkaSource(["payments"], bounded=True, max_records_per_partition=20_000),
        sink=KafkaSink(f"{name}-out"),
    )
    options = AgentOptions(
        bootstrap, checkpoint_dir=str(root / "checkpoints"), max_rows_per_round=10_000
    )
    agent = Agent(job, options, codec, spark=spark)
    threading.Timer(40, agent.stop).start()
    status = agent.run()
    durations = [
        e.duration_ms
        for r in replay_topic(bootstrap, codec, CHECKPOINT_EVENTS)
        if isinstance(e := r.event, CheckpointLifecycleEvent)
        and e.job_id == job.id
        and e.event_type is CheckpointEventType.COMPLETED
        and e.duration_ms is not None
    ]
    figures = percentiles(durations)
    print(f"{mode}: {status.name}, checkpoints {figures}")
    return figures


def read_sink(bootstrap: str, topic: str) -> list[tuple[str, str, int, int]]:
    import json

    from confluent_kafka import Consumer, TopicPartition

    from sparkpoint.common.kafka import consumer_config, true_end_offset

    consumer = Consumer(consumer_config(bootstrap, read_committed=True))
    out = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: true_end_offset(consumer, topic, p) for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    row = json.loads(message.value() or b"{}")
                    out.append((row["kind"], row["account"], row["id"], row["value"]))
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    finally:
        consumer.close()
    return out


if __name__ == "__main__":
    main()
