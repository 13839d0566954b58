"""The sparkpoint jobs of bench/latency.py, built from the environment. The benchmark runs each
as a user would, ``sparkpoint agent bench/latency_job.py:job`` in a process of its own, so the
job is a function of environment variables rather than of arguments:

- ``LATENCY_WORKLOAD``: ``example`` (the bundled example job, ``sparkpoint.agent.example``:
  running totals and 10 s window counts per account over payments, refunds dropped) or
  ``peers`` (bench/peers.py's workload: a running sum per user, every updated sum written);
- ``LATENCY_NAME`` (the job id), ``LATENCY_INPUT`` and ``LATENCY_OUTPUT`` (topics);
- ``LATENCY_GUARANTEE``: ``EXACTLY_ONCE`` (the default, KafkaSink's default) or
  ``AT_LEAST_ONCE``;
- ``LATENCY_BOUNDED``: ``1`` reads the input up to the end it has when the job starts and then
  finishes (the pre-filled throughput run); otherwise the source follows the topic.

Both jobs: parallelism 2, checkpoints every 1 s with no minimum pause. The keyed function of
the peers workload is defined here, not imported from bench/peers: the agent ships a job file's
module to Spark's workers by value, while a module found through ``sys.path`` only would fail
to unpickle there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

import pandas as pd

from sparkpoint.agent.example import example_job
from sparkpoint.agent.job import (
    DeliveryGuarantee,
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
)

SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
}


class RunningSum(KeyedFunction):
    """bench/peers/sparkpoint_running_sum.py's function: each record's running sum of its user."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {"sum": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        user = records["user"]
        base = user.map(state.value("sum")).fillna(0).astype("int64")
        sums = base + records.groupby("user", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("sum", sums.groupby(user, sort=False).last())
        return pd.DataFrame({"user": user, "sum": sums})


def job() -> Job:
    env = os.environ
    name, source, output = env["LATENCY_NAME"], env["LATENCY_INPUT"], env["LATENCY_OUTPUT"]
    bounded = env.get("LATENCY_BOUNDED") == "1"
    guarantee = DeliveryGuarantee(env.get("LATENCY_GUARANTEE", "EXACTLY_ONCE"))
    sink = KafkaSink(output, delivery_guarantee=guarantee)
    workload = env["LATENCY_WORKLOAD"]
    settings = SETTINGS | (  # a comparison of round pacing (LATENCY_BUFFER_TIMEOUT=0ms: none)
        {"execution.buffer-timeout.interval": env["LATENCY_BUFFER_TIMEOUT"]}
        if env.get("LATENCY_BUFFER_TIMEOUT")
        else {}
    )
    if workload == "example":
        built = example_job(name, source, output, bounded=bounded, settings=settings)
        return replace(built, sink=sink)
    if workload == "peers":
        return Job(
            name=name,
            source=KafkaSource([source], bounded=bounded),
            key="user",
            function=RunningSum(),
            sink=sink,
            parallelism=2,
            settings=settings,
        )
    raise ValueError(f"LATENCY_WORKLOAD: unknown workload {workload!r}")
