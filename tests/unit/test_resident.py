"""Resident tasks' pure parts (services/sparkpoint/agent/spark/resident.py): the slots of a local
master, which pool a free worker serves next, and the work functions a worker keeps."""

from __future__ import annotations

import os

import pytest

from sparkpoint.agent.spark.resident import WORKS_KEPT, KeptWorks, local_slots, next_pool


@pytest.mark.parametrize(
    ("master", "task_cpus", "slots"),
    [
        ("local", 1, 1),
        ("local[2]", 1, 2),
        ("local[4]", 2, 2),
        ("local[3, 2]", 1, 3),
        ("local[*]", 1, os.cpu_count()),
        ("local[*,4]", 1, os.cpu_count()),
        ("local-cluster[2,3,1024]", 1, 6),
        ("local[1]", 4, 1),
    ],
)
def test_a_local_master_has_its_slots(master: str, task_cpus: int, slots: int) -> None:
    assert local_slots(master, task_cpus) == slots


@pytest.mark.parametrize(
    "master", ["spark://host:7077", "yarn", "k8s://https://host:443", "local[x]", "localhost"]
)
def test_any_other_master_has_none(master: str) -> None:
    assert local_slots(master) is None


def test_a_free_worker_serves_the_pool_running_fewest_then_the_name_sorting_first() -> None:
    assert next_pool({}, {}) is None
    assert next_pool({"stage2": 0, "sink": 0}, {}) is None
    assert next_pool({"stage2": 3}, {"stage2": 2, "sink": 0}) == "stage2"
    # as spark_pools.xml has FAIR do: a completed epoch's task before the next round's
    assert next_pool({"stage2": 2, "sink": 1}, {}) == "sink"
    assert next_pool({"stage2": 2, "sink": 1}, {"sink": 1}) == "stage2"
    assert next_pool({"stage2": 1, "snapshot": 1}, {"stage2": 2, "snapshot": 1}) == "snapshot"
    assert next_pool({"stage2": 1, "recovery": 1}, {"stage2": 1, "recovery": 1}) == "recovery"


def test_the_agent_and_a_worker_keep_the_same_works_least_recently_used_out() -> None:
    agent, worker = KeptWorks(), KeptWorks()
    sent = []
    digests = [bytes([n % (WORKS_KEPT + 3)]) for n in range(200)] + [b"\x00"] * 3
    for digest in digests:
        first = not agent.has(digest)
        agent.keep(digest)
        if first:
            sent.append(digest)
            worker.keep(digest, f"work {digest!r}")
        worker.keep(digest)
        assert digest in worker.kept, "a work sent once is there whenever the agent sends none"
        assert list(agent.kept) == list(worker.kept)
    assert len(worker.kept) == WORKS_KEPT
    assert len(sent) > WORKS_KEPT + 3, "a cycle longer than what is kept sends again"
    one = KeptWorks()
    for _ in range(50):
        one.keep(b"round")
    assert list(one.kept) == [b"round"]
