"""Two real coordinator instances sharing the jobs' partitions: Flink's clients, which follow no
redirect, get the owning instance's answer from either; a JobID is routed by itself (no instance
needs to have seen the job); a JobID nobody knows is answered 404 without a loop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.flink_ids import flink_job_id
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import ScriptedAgent


@pytest.fixture(scope="module")
def pair(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Running, Running]]:
    root = tmp_path_factory.mktemp("forwarding")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        first = coordinator_in_thread(kafka, root)
        second = coordinator_in_thread(kafka, root)
        a, b = next(first), next(second)
        wait(
            lambda: (
                len(a.service.writers) == len(b.service.writers) == 1
                and all(p in a.service.owners for p in b.service.writers)
            ),
            60,
            "each instance owns one partition and knows the other",
        )
        yield a, b
        for instance in (second, first):
            next(instance, None)


def job_owned_by(owner: Running, codec: EventCodec) -> ScriptedAgent:
    """A job whose partition ``owner`` owns (job ids are tried until one lands there)."""
    partition = next(iter(owner.service.writers))
    while True:
        agent = ScriptedAgent(
            owner.bootstrap, codec, f"job-{uuid.uuid4().hex[:8]}", state_dir=owner.root
        )
        agent.register()
        if agent.partition == partition:
            agent.start()
            wait(lambda a=agent: a.job_id in owner.service.jobs, what="registered")
            return agent
        agent.publisher.close()


def test_flink_clients_get_the_owners_answers_through_the_other_instance(
    pair: tuple[Running, Running], codec: EventCodec
) -> None:
    here, owner = pair
    agent = job_owned_by(owner, codec)
    jid = flink_job_id(agent.job_id)
    try:
        assert agent.job_id not in here.service.jobs
        with here.client() as client:
            details = client.get(f"/v1/jobs/{jid}")
            assert details.status_code == 200 and details.json()["jid"] == jid
            redirected = client.get(f"/jobs/{jid}")
            assert redirected.status_code == 307
            assert redirected.headers["location"].startswith(f"{owner.url}/jobs/{jid}?")
            assert client.get(f"/jobs/{agent.job_id}").headers["location"] == (
                f"{owner.url}/jobs/{agent.job_id}"
            )
            cancelled = client.patch(f"/v1/jobs/{jid}", params={"mode": "cancel"})
            assert (cancelled.status_code, cancelled.json()) == (202, {})
            agent.wait_for(lambda: len(agent.cancels) == 1, what="the cancellation")
            unknown = flink_job_id(f"never-registered-{uuid.uuid4().hex}")
            assert client.get(f"/v1/jobs/{unknown}").status_code == 404
            followed = client.get(f"/jobs/{unknown}", follow_redirects=True)
            # each of the (at most two) partitions a JobID names is asked once
            assert followed.status_code == 404 and len(followed.history) <= 2
            assert all("sparkpoint-hop" in r.headers["location"] for r in followed.history)
    finally:
        agent.stop()
