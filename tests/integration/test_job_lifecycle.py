"""A job's lifecycle at the coordinator, with scripted agents on the real broker: checkpoint ids
never repeat (a finished job registered again, a restart, a takeover), one agent drives a job
(a second is refused while the first lives), answers from other agents or attempts are refused,
malformed registrations and forged events change nothing, and a forged acknowledgement deletes
no file it does not provably own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    JobStatus,
    JobStatusChanged,
    StateHandle,
    StateHandleKind,
)
from sparkpoint.common.kafka import EventPublisher, make_producer
from sparkpoint.common.limits import LEASE_TIMEOUT_MS
from sparkpoint.common.topics import ACKS, JOBS
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import ScriptedAgent


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    tmp_path = tmp_path_factory.mktemp("lifecycle")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path)


def periodic(interval: str = "200ms") -> dict[str, str]:
    return {"execution.checkpointing.interval": interval, "execution.checkpointing.timeout": "10s"}


def scripted(
    coordinator: Running, codec: EventCodec, job_id: str, **kwargs: object
) -> ScriptedAgent:
    agent = ScriptedAgent(
        coordinator.bootstrap,
        codec,
        job_id,
        state_dir=coordinator.root,
        **kwargs,  # type: ignore[arg-type]
    )
    return agent.start()


def accepted(agent: ScriptedAgent) -> bool:
    return any(r.accepted for r in agent.responses)


def completed_ids(coordinator: Running, job_id: str) -> int:
    job = coordinator.service.jobs.get(job_id) or coordinator.service.ended[job_id]
    return job.core.stats.completed


def rejected(coordinator: Running, kind: str) -> int:
    return sum(n for (_, k), n in coordinator.service.rejected.items() if k == kind)


def publisher(coordinator: Running, codec: EventCodec) -> EventPublisher:
    return EventPublisher(make_producer(coordinator.bootstrap, one_record_per_batch=True), codec)


# --- checkpoint ids strictly increase, forever ---------------------------------------------------------


def test_a_finished_job_registered_again_continues_above_every_id_it_used(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"backfill-{uuid.uuid4().hex[:6]}"
    first = scripted(coordinator, codec, job_id, configuration=periodic())
    first.wait_for(lambda: len(first.completed) >= 4, what="four checkpoints")
    first.finish()
    wait(lambda: job_id in coordinator.service.ended, what="the job ended")
    first.stop()
    used = max(t.checkpoint_id for t in first.triggers)

    again = scripted(coordinator, codec, job_id, configuration=periodic())  # a new agent
    again.wait_for(lambda: len(again.completed) >= 2, what="checkpoints of the second run")
    again.finish()
    again.stop()
    assert accepted(again)
    assert min(t.checkpoint_id for t in again.triggers) > used, (
        [t.checkpoint_id for t in first.triggers],
        [t.checkpoint_id for t in again.triggers],
    )
    record = coordinator.service.durable[job_id]
    assert record.checkpoint_id_counter > max(t.checkpoint_id for t in again.triggers)


def test_a_job_new_to_the_coordinator_starts_above_checkpoint_directories_on_storage(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"wiped-{uuid.uuid4().hex[:6]}"
    (coordinator.root / "checkpoints" / job_id / "chk-41").mkdir(parents=True)  # broker lost it
    agent = scripted(coordinator, codec, job_id, configuration=periodic())
    agent.wait_for(lambda: agent.triggers, what="a trigger")
    agent.finish()
    agent.stop()
    assert agent.triggers[0].checkpoint_id == 42


# --- one agent drives a job ----------------------------------------------------------------------------


def test_a_second_agent_is_refused_while_the_first_is_alive_and_changes_nothing(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"single-{uuid.uuid4().hex[:6]}"
    first = scripted(coordinator, codec, job_id, configuration=periodic())
    first.wait_for(lambda: len(first.completed) >= 3, what="checkpoints of the first agent")
    before = completed_ids(coordinator, job_id)
    second = scripted(coordinator, codec, job_id, configuration=periodic(), attempt=5)
    second.wait_for(lambda: second.responses, what="an answer to the second agent")
    (answer,) = second.responses
    assert not answer.accepted and answer.refusal == "LEASE_HELD"
    assert (answer.holder_agent_id, answer.holder_attempt) == (first.agent_id, 0)
    assert answer.holder_seen_ms_ago is not None and answer.holder_seen_ms_ago < LEASE_TIMEOUT_MS
    count = len(first.completed)
    first.wait_for(lambda: len(first.completed) >= count + 3, what="the first agent goes on")
    assert coordinator.service.jobs[job_id].registration.agent_id == first.agent_id
    second.stop()
    first.finish()
    first.stop()
    assert second.triggers == []  # nothing was ever addressed to the refused agent
    assert completed_ids(coordinator, job_id) >= before + 3  # counts went on, not back to 0
    with coordinator.client() as client:
        metrics = client.get("/metrics").text
    assert 'sparkpoint_rejected_events_total{topic="jobs",kind="registration"}' in metrics


def test_another_agent_takes_over_once_the_lease_ran_out_above_the_attempt(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"takeover-{uuid.uuid4().hex[:6]}"
    first = scripted(coordinator, codec, job_id, configuration=periodic(), attempt=2)
    first.wait_for(lambda: len(first.completed) >= 2, what="checkpoints of the first agent")
    first.stop()  # dies: no more heartbeats or answers
    time.sleep(LEASE_TIMEOUT_MS / 1000 + 0.5)
    used = max(t.checkpoint_id for t in first.triggers)

    late = scripted(coordinator, codec, job_id, configuration=periodic(), attempt=1)
    late.wait_for(lambda: late.responses, what="an answer")
    late.stop()
    assert late.responses[0].refusal == "ATTEMPT" and late.responses[0].holder_attempt == 2

    second = scripted(coordinator, codec, job_id, configuration=periodic(), attempt=3)
    second.wait_for(lambda: len(second.completed) >= 2, what="checkpoints after the takeover")
    second.finish()
    second.stop()
    assert accepted(second)
    assert min(t.checkpoint_id for t in second.triggers) > used
    assert all((t.agent_id, t.attempt) == (second.agent_id, 3) for t in second.triggers)


# --- answers from anyone else are refused --------------------------------------------------------------


def test_answers_and_status_from_another_agent_or_attempt_are_refused(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"answers-{uuid.uuid4().hex[:6]}"
    agent = scripted(coordinator, codec, job_id, configuration=periodic(), attempt=1)
    agent.wait_for(lambda: len(agent.completed) >= 2, what="checkpoints")
    acks_before = rejected(coordinator, "acknowledgement")
    status_before = rejected(coordinator, "status")
    forged = publisher(coordinator, codec)
    pending_id = agent.triggers[-1].checkpoint_id + 1
    stale = AcknowledgeCheckpoint(
        job_id, pending_id, "keyed-0", 0, 0, [], 0, 0, 0, 0, 0, False, agent_id=agent.agent_id
    )
    forged.publish_sync(ACKS, job_id, stale)  # the attempt before
    forged.publish_sync(ACKS, job_id, replace(stale, agent_id="agent-impostor", attempt=1))
    for status in (JobStatus.CANCELED, JobStatus.FINISHED):
        forged.publish_sync(JOBS, job_id, JobStatusChanged(job_id, "agent-impostor", 1, status, 0))
    forged.publish_sync(
        JOBS, job_id, JobStatusChanged(job_id, agent.agent_id, 0, JobStatus.FAILED, 0)
    )
    forged.publish_sync(JOBS, job_id, None)  # a tombstone for a running job
    forged.close()
    wait(lambda: rejected(coordinator, "status") >= status_before + 3, what="status refused")
    count = len(agent.completed)
    agent.wait_for(lambda: len(agent.completed) >= count + 2, what="the job goes on")
    assert coordinator.service.jobs[job_id].status is JobStatus.RUNNING
    agent.finish()
    agent.stop()
    assert rejected(coordinator, "acknowledgement") >= acks_before + 2
    assert rejected(coordinator, "tombstone") >= 1


def test_malformed_registrations_are_refused_and_the_running_job_is_untouched(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"victim-{uuid.uuid4().hex[:6]}"
    agent = scripted(coordinator, codec, job_id, configuration=periodic())
    agent.wait_for(lambda: len(agent.completed) >= 3, what="checkpoints")
    registered = coordinator.service.jobs[job_id].registration
    before = rejected(coordinator, "registration")
    forged = publisher(coordinator, codec)
    hostile = [
        replace(registered, agent_id="agent-x", parallelism=0),
        replace(registered, agent_id="agent-x", parallelism=10**9, max_parallelism=10**9),
        replace(registered, agent_id="agent-x", subtasks=[]),
        replace(registered, agent_id="agent-x", attempt=-3),
        replace(registered, attempt=9, configuration={"execution.checkpointing.dir": "/etc"}),
    ]
    for registration in hostile:
        forged.publish_sync(JOBS, job_id, registration)
    for bad_id in ("../../etc", "x" * 5000):
        forged.publish_sync(JOBS, bad_id, replace(registered, job_id=bad_id))
    forged.close()
    wait(
        lambda: rejected(coordinator, "registration") >= before + len(hostile) + 2, what="refusals"
    )
    count = len(agent.completed)
    agent.wait_for(lambda: len(agent.completed) >= count + 3, what="the job goes on")
    job = coordinator.service.jobs[job_id]
    agent.finish()
    agent.stop()
    assert job.registration is registered
    assert "../../etc" not in coordinator.service.jobs
    # the running attempt was never refused: answers went to the forged registrations
    assert [r.attempt for r in agent.responses if not r.accepted] == [9]


# --- only the owner deletes ----------------------------------------------------------------------------


def test_a_forged_acknowledgement_deletes_nothing_it_does_not_provably_own(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = f"owner-{uuid.uuid4().hex[:6]}"
    agent = scripted(coordinator, codec, job_id, configuration=periodic("1h"))
    agent.wait_for(lambda: accepted(agent), what="the registration accepted")
    with coordinator.client() as client:
        for expected in (1, 2):
            client.post(f"/jobs/{job_id}/checkpoints")
            agent.wait_for(lambda n=expected: len(agent.completed) >= n, what="a checkpoint")
    root = coordinator.root / "checkpoints"
    retained = coordinator.service.jobs[job_id].core.store.latest()
    assert retained is not None and retained.files
    kept = [Path(f) for f in retained.files]
    other_job = root / "someone-else" / "shared" / "kg-00001.arrow"
    other_job.parent.mkdir(parents=True, exist_ok=True)
    other_job.write_bytes(b"not yours")
    outside = coordinator.root / "outside.txt"
    outside.write_text("not yours either")
    traversal = (
        root / job_id / "shared" / ".." / ".." / "someone-else" / "shared" / "kg-00001.arrow"
    )
    before = rejected(coordinator, "acknowledgement")
    forged = publisher(coordinator, codec)
    late_id = agent.triggers[0].checkpoint_id  # ended: subsumed by the second
    for checkpoint_id in (late_id, 10**6, 2**62):
        for path in [*kept, other_job, outside, traversal]:
            handle = StateHandle(str(path), StateHandleKind.KEYED_STATE, 1)
            ack = AcknowledgeCheckpoint(
                job_id, checkpoint_id, "keyed-0", 0, 0, [handle], 1, 0, 0, 0, 0, False,
                agent_id=agent.agent_id,
            )  # fmt: skip
            forged.publish_sync(ACKS, job_id, ack)
    forged.close()
    wait(lambda: rejected(coordinator, "acknowledgement") >= before + 12, what="all refused")
    time.sleep(0.5)  # discards run on a worker thread: give a wrong one the chance to happen
    assert all(path.exists() for path in kept)  # the retained checkpoint's files
    agent.finish()
    agent.stop()
    assert other_job.read_bytes() == b"not yours"
    assert outside.read_text() == "not yours either"


def test_a_trigger_fetched_with_the_registration_answer_reaches_the_job_loop(
    kafka: KafkaUnderTest, new_topic: Callable[..., str]
) -> None:
    """The coordinator's first trigger may follow its answer to a registration within one fetch
    (the first trigger comes after a random delay from 0 ms). The agent's registration takes the
    answer; the trigger is still the next event its job loop reads. It was dropped once, and
    the job's first checkpoint expired a minute later."""
    import threading

    from confluent_kafka import Producer, TopicPartition

    from sparkpoint.agent.control.membership import Membership
    from sparkpoint.common.events import JobRegistered, RegistrationResponse, SnapshotType
    from sparkpoint.common.events import TriggerCheckpoint as Trigger
    from sparkpoint.common.kafka import EventSubscriber, make_consumer

    codec, topic, job_id, agent_id = EventCodec(), new_topic(), "answered", "agent-a"
    answer = RegistrationResponse(job_id, 1, agent_id, 0, True, 0, checkpoint_id_counter=1)
    first = Trigger(
        job_id, 1, 1, 0, SnapshotType.CHECKPOINT, True, False, "/tmp/chk-1",
        agent_id=agent_id, attempt=0,
    )  # fmt: skip
    batch = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 200})  # one batch
    for event in (answer, first):
        batch.produce(topic, key=job_id.encode(), value=codec.encode(event))
    assert batch.flush(10) == 0
    control = EventSubscriber(make_consumer(kafka.bootstrap), codec)
    control.assign([TopicPartition(topic, 0, 0)])
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    member = Membership(job_id, agent_id, publisher, threading.Event())

    def registration(attempt: int) -> JobRegistered:
        return JobRegistered(
            job_id, job_id, agent_id, attempt, JobStatus.RUNNING, 1, 128, [], {}, 0
        )

    assert member.register(registration, control, 0) == answer
    heard = [r.event for r in control.poll(1.0, 10)]
    control.close()
    assert heard == [first]
