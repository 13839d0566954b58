"""Where an instance sends a request for a job it does not have (CoordinatorService.route): by
the job id's partition, or for a Flink JobID by each partition it may name, never one tried
already, never its own. Three instances, twelve partitions, no I/O (the service is not run)."""

from __future__ import annotations

import uuid

import pytest

from sparkpoint.common.events import CoordinatorAnnouncement
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.kafka import partition_of
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.service.instance import CoordinatorService, ServiceSettings

pytestmark = pytest.mark.unit

PARTITIONS = 12


def instances() -> list[CoordinatorService]:
    """Three services, each owning four partitions and knowing who owns the rest."""
    services = [
        CoordinatorService(
            ServiceSettings("127.0.0.1:1", CheckpointConfig(), rest_url=f"http://instance-{i}")
        )
        for i in range(3)
    ]
    for i, service in enumerate(services):
        service.partition_count = PARTITIONS
        service.writers = {p: object() for p in range(PARTITIONS) if p % 3 == i}  # type: ignore[misc]
        for j, other in enumerate(services):
            announcement = CoordinatorAnnouncement(
                other.settings.instance_id, f"http://instance-{j}", [], {}, 0
            )
            service.owners.update({p: announcement for p in range(PARTITIONS) if p % 3 == j})
    return services


def follow(
    services: list[CoordinatorService], start: int, name: str, job_id: str | None
) -> list[int]:
    """The instances a request for ``name`` visits: until the one that has ``job_id`` (owns its
    partition, so it answers), or one that sends it nowhere (404). ``None``: no one has it."""
    visited, tried = [start], set[int]()
    while True:
        service = services[visited[-1]]
        if job_id is not None and partition_of(job_id, PARTITIONS) in service.writers:
            return visited
        routed = service.route(name, tried)
        if routed is None:
            return visited
        url, partition = routed
        tried.add(partition)
        visited.append(int(url.rsplit("-", 1)[1]))
        assert len(visited) <= 3, visited  # never a loop


@pytest.mark.parametrize("start", [0, 1, 2])
def test_a_flink_job_id_reaches_the_owner_of_its_job_from_any_instance(start: int) -> None:
    services = instances()
    for i in range(300):
        job_id = f"job-{i}"
        owner = partition_of(job_id, PARTITIONS) % 3
        assert follow(services, start, flink_job_id(job_id), job_id)[-1] == owner


@pytest.mark.parametrize("start", [0, 1, 2])
def test_a_job_id_of_32_hex_digits_reaches_its_owner_in_either_case(start: int) -> None:
    services = instances()
    for _ in range(300):
        job_id = uuid.uuid4().hex
        for written in (job_id, job_id.upper()):  # a job registered with upper-case digits too
            owner = partition_of(written, PARTITIONS) % 3
            assert follow(services, start, written, written)[-1] == owner, written


def test_a_plain_job_id_is_sent_once_to_its_partitions_owner_and_no_further() -> None:
    services = instances()
    job_id = "payments-example"
    owner = partition_of(job_id, PARTITIONS) % 3
    for start in range(3):
        visited = follow(services, start, job_id, job_id)
        assert visited[-1] == owner and len(visited) <= 2


def test_a_job_id_nobody_has_ends_in_a_404_after_each_partition_was_asked_once() -> None:
    services = instances()
    hops = []
    for i in range(100):
        name = flink_job_id(f"never-registered-{i}")
        visited = follow(services, 0, name, None)  # asserts it never loops
        hops.append(len(visited) - 1)
    assert max(hops) == 2  # both partitions a JobID names were asked, on other instances
