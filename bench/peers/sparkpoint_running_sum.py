"""The peers benchmark's sparkpoint job (sparkpoint_job.py launches the driver's JVM first, as
`sparkpoint agent` does, and then runs `run`): a running sum per user, every updated sum written
to the output topic.

The job: a bounded Kafka source, key ``user``, a keyed function with one int64 value state,
vectorized over each key group's batch as the example job's PaymentStats is, an exactly-once
Kafka sink, parallelism 2 on Spark ``local[2]``, unaligned checkpoints every 1 s with no minimum
pause (an aligned one waits for the round in flight, about half a round on a backlog). The agent
starts its own session, so its work runs in resident tasks (docs/jobs.md); ``--spark-jobs``
runs a Spark job per round instead, as a cluster does.
The agent runs in this process as ``sparkpoint agent`` runs it; its ``start_seconds`` (Spark
start and warm-up, source positions, registration) is reported so the benchmark can leave it
out, and the moment the first round that processed records ended (``first_processed``, watched
every 5 ms). Checkpoint durations are read by the benchmark from the audit topic.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import ClassVar

import pandas as pd
from common import Clock, report
from pyspark import cloudpickle

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
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobStatus

SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.unaligned.enabled": "true",
}


class RunningSum(KeyedFunction):
    state: ClassVar[Mapping[str, StateDescriptor]] = {"sum": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        user = records["user"]
        base = user.map(state.value("sum")).fillna(0).astype("int64")
        sums = base + records.groupby("user", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("sum", sums.groupby(user, sort=False).last())
        return pd.DataFrame({"user": user, "sum": sums})


def running_sum_job(name: str, input_topic: str, output_topic: str, bounded: bool = True) -> Job:
    return Job(
        name=name,
        source=KafkaSource([input_topic], bounded=bounded),
        key="user",
        function=RunningSum(),
        sink=KafkaSink(output_topic),
        parallelism=2,
        settings=SETTINGS,
    )


def agent_of(args: argparse.Namespace, bounded: bool = True) -> tuple[Job, Agent]:
    """The job over ``args.input`` and its agent, as `sparkpoint agent` would run it."""
    logging.basicConfig(level=logging.WARNING)
    # the workers cannot import this file's module (bench/peers is not on their path): the
    # function travels by value, as a job that `sparkpoint agent` loads from a file does
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    job = running_sum_job(args.name, args.input, args.output, bounded)
    options = AgentOptions(
        args.bootstrap, master="local[2]", checkpoint_dir=args.work_dir,
        resident_tasks=False if args.spark_jobs else None,
    )  # fmt: skip
    return job, Agent(job, options, EventCodec())


def run(args: argparse.Namespace) -> None:
    clock = Clock()
    job, agent = agent_of(args)
    started = time.monotonic()
    first_processed: list[float] = []

    def watch_first_round() -> None:
        # the first round that processed records ends: its rows are counted at its collection
        while not first_processed and not stopped.wait(0.005):
            if agent.processed_rows > 0:
                first_processed.append(time.monotonic())

    # this process's CPU (every thread) from its first turn after registering to the end: the
    # driver's part of the scale model, exact (a /proc sample every 0.25 s is not, at a start)
    cpu_at_start: list[float] = []
    # and the job's loop's own (this thread: `agent.run` turns it here), apart from the
    # process's other threads (the control link, heartbeats, librdkafka's, the sink's commits)
    loop_cpu_at_start: list[float] = []

    def first_turn(_: Agent) -> None:
        if not cpu_at_start:
            cpu_at_start.append(time.process_time())
            loop_cpu_at_start.append(time.thread_time())

    agent.on_round = first_turn
    stopped = threading.Event()
    threading.Thread(target=watch_first_round, name="first-round", daemon=True).start()
    status = agent.run()
    stopped.set()
    clock.done = time.monotonic()
    cpu_at_end, loop_cpu_at_end = time.process_time(), time.thread_time()
    if status is not JobStatus.FINISHED:
        raise SystemExit(f"job {job.id} ended {status.name}, not FINISHED")
    report(
        {
            "job_id": job.id,
            "registered": started + agent.start_seconds,
            "done": clock.done,
            "start_seconds": agent.start_seconds,
            "first_processed": first_processed[0] if first_processed else None,
            "process_cpu_seconds_after_start": round(cpu_at_end - cpu_at_start[0], 3),
            "loop_cpu_seconds_after_start": round(loop_cpu_at_end - loop_cpu_at_start[0], 3),
            "rounds": agent.stages.rounds,
            "processed_rows": agent.processed_rows,
            "restarts": agent.restarts,
            "versions": {
                name: importlib.metadata.version(name)
                for name in ("sparkpoint", "pyspark", "confluent-kafka")
            },
        }
    )


SETTLE_S = 3.0
"""Seconds after the first turn before the idle run is measured (the first checkpoints)."""


def idle(args: argparse.Namespace) -> None:
    """The same job on an empty topic that stays open: checkpoints every second, heartbeats,
    the control link, with no record to process. Reports this process's CPU (every thread, its
    own clock) and its loop thread's over ``--idle-seconds`` after `SETTLE_S`, and when that
    was, so the benchmark can take the other processes' CPU over the same span."""
    job, agent = agent_of(args, bounded=False)
    turned = threading.Event()
    agent.on_round = lambda _: turned.set()
    running = threading.Thread(target=agent.run, name="idle-job", daemon=True)
    running.start()
    if not turned.wait(300):
        raise SystemExit(f"job {job.id} did not start within 300 s")
    time.sleep(SETTLE_S)
    assert running.ident is not None
    loop_clock = time.pthread_getcpuclockid(running.ident)
    idle_from, cpu_from, rounds_from = time.monotonic(), time.process_time(), agent.stages.rounds
    loop_from = time.clock_gettime(loop_clock)
    time.sleep(args.idle_seconds)
    idle_to, cpu_to, rounds_to = time.monotonic(), time.process_time(), agent.stages.rounds
    loop_to = time.clock_gettime(loop_clock)
    agent.stop()
    running.join(120)
    report(
        {
            "job_id": job.id,
            "idle_from": idle_from,
            "idle_to": idle_to,
            "process_cpu_seconds": round(cpu_to - cpu_from, 3),
            "loop_cpu_seconds": round(loop_to - loop_from, 3),
            "rounds": rounds_to - rounds_from,
            "status": agent.status.name,
        }
    )
