"""Keyed state larger than the workers' memory budget: a running sum over 200,000 keys (about 6 MB
of state) with ``state.backend.memory.fixed-per-slot`` at its floor, 1 MB, key groups
materialized every 2 s, stopped with a savepoint at parallelism 2, restored at 4 and stopped
again, restored at 1 to the end: the committed output is exactly the reference."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

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
from sparkpoint.agent.runtime import Agent
from sparkpoint.common.events import JobStatus
from sparkpoint.common.kafka import make_admin, producer_config
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import difference, in_process, read_output, run_in_process
from tests.running_coordinator import Running, coordinator_in_thread

pytestmark = pytest.mark.spark

KEYS = 200_000
UPDATES = 50_000
SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.incremental": "true",
    "state.backend.memory.fixed-per-slot": "1 mb",
    "state.changelog.periodic-materialize.interval": "2s",
}


class SlowSum(KeyedFunction):
    """Each record's running sum of its user, 0.2 s a round (the stops land mid-input)."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {"sum": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(0.2)
        user = records["user"]
        base = user.map(state.value("sum")).fillna(0).astype("int64")
        sums = base + records.groupby("user", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("sum", sums.groupby(user, sort=False).last())
        return pd.DataFrame({"user": user, "sum": sums})


@pytest.fixture(scope="module", autouse=True)
def function_travels_by_value() -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("budget"))


def fill(bootstrap: str, topic: str) -> list[tuple[str, int]]:
    """Every key once, then random updates; returns the (user, amount) records in order."""
    admin = make_admin(bootstrap)  # referenced until the topic exists
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    rng = np.random.default_rng(3)
    users = np.concatenate([np.arange(KEYS), rng.integers(0, KEYS, UPDATES)])
    amounts = rng.integers(1, 100, len(users))
    producer = Producer(producer_config(bootstrap) | {"linger.ms": 20})
    written = []
    for user_id, amount in zip(users, amounts, strict=True):
        user = f"u{user_id}"
        value = json.dumps({"user": user, "amount": int(amount)}).encode()
        while True:
            try:
                producer.produce(topic, value, user.encode())
                break
            except BufferError:
                producer.poll(0.05)
        written.append((user, int(amount)))
    assert producer.flush(60) == 0
    return written


def reference(written: list[tuple[str, int]]) -> list[tuple[str, int]]:
    sums: dict[str, int] = {}
    out = []
    for user, amount in written:
        sums[user] = sums.get(user, 0) + amount
        out.append((user, sums[user]))
    return sorted(out)


def stop_after_two_checkpoints(coordinator: Running, agent: Agent, job: Job) -> str:
    """Runs ``agent`` until two checkpoints completed, stops it with a savepoint; its path."""
    client = coordinator.client()
    stopped: list[str] = []

    def stop(running: Agent) -> None:
        if not stopped and len(running.completed_checkpoints) >= 2:
            body = {"targetDirectory": str(coordinator.root / "savepoints")}
            stopped.append(client.post(f"/jobs/{job.id}/stop", json=body).json()["request-id"])

    agent.on_round = stop
    assert agent.run() is JobStatus.FINISHED and stopped
    assert not agent.source.finished(), "stopped before the end of its input"
    answer = client.get(f"/jobs/{job.id}/savepoints/{stopped[0]}").json()
    client.close()
    return str(answer["operation"]["location"])


def test_state_four_times_the_memory_budget_rescales_2_4_1_and_commits_exactly(
    coordinator: Running, kafka: KafkaUnderTest, spark: Any
) -> None:
    name = f"budget-{uuid.uuid4().hex[:8]}"
    topic, output = f"{name}-in", f"{name}-out"
    written = fill(kafka.bootstrap, topic)
    job = Job(
        name=name,
        source=KafkaSource([topic], bounded=True, max_records_per_partition=4_000),
        key="user",
        function=SlowSum(),
        sink=KafkaSink(output, delivery_guarantee=DeliveryGuarantee.EXACTLY_ONCE),
        parallelism=2,
        settings=SETTINGS,
    )
    first = stop_after_two_checkpoints(coordinator, in_process(job, coordinator, spark), job)
    again = in_process(job, coordinator, spark, restore=first, parallelism=4)
    second = stop_after_two_checkpoints(coordinator, again, job)
    status, last = run_in_process(job, coordinator, spark, restore=second, parallelism=1)
    assert status is JobStatus.FINISHED and last.parallelism == 1

    state_bytes = last.parts.backend.state_bytes
    assert state_bytes >= 4 * (1 << 20), f"the state ({state_bytes} bytes) is 4x the budget"
    got = read_output(coordinator.bootstrap, output, lambda v: tuple(json.loads(v).values()))
    expected = reference(written)
    assert got == expected, difference(got, expected)
