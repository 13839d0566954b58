"""The history service (`sparkpoint history`, faust) against real coordinators on the session's
broker: its documents equal a full replay of the audit topics, after a restart of the service
(recovered from its table's changelog) and across a coordinator failover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiokafka
import aiokafka.errors
import httpx
import pytest

from sparkpoint import audit
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent, SnapshotType
from sparkpoint.common.kafka import (
    EventPublisher,
    end_offsets,
    make_consumer,
    make_producer,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES, JOBS
from sparkpoint.history import model
from tests.conftest import KafkaUnderTest
from tests.factories import config_change, job_registered
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.running_history import HistoryProcess

PERIODIC = {"execution.checkpointing.interval": "100ms"}


def replayed(bootstrap: str, codec: EventCodec, job_id: str) -> model.Doc:
    """What a full replay of the audit topics makes of the job: the reference."""
    doc = model.new_job(job_id)
    for topic in (JOBS, CHECKPOINT_EVENTS, CONFIG_CHANGES):
        for record in replay_topic(bootstrap, codec, topic.name()):
            if record.event is not None and getattr(record.event, "job_id", None) == job_id:
                model.apply(doc, record.event, record.topic, record.partition, record.offset)
    return doc


def comparable(doc: model.Doc) -> str:
    """A document without the offsets it remembers: a batch of nothing but events the history
    ignores is not written, so only what the events said is compared."""
    return json.dumps({k: v for k, v in doc.items() if k != "applied"}, sort_keys=True)


def served(history: HistoryProcess, job_id: str) -> model.Doc | None:
    try:
        answer = history.get(f"/jobs/{job_id}/history")
    except httpx.HTTPError:
        return None
    return answer.json() if answer.status_code == 200 else None


def wait_equal(history: HistoryProcess, reference: model.Doc, timeout_s: float = 30.0) -> None:
    expected = comparable(reference)
    last: list[model.Doc | None] = [None]

    def equal() -> bool:
        last[0] = served(history, reference["job_id"])
        return last[0] is not None and comparable(last[0]) == expected

    try:
        wait(equal, timeout_s, what="the served history equal to the replay")
    except AssertionError:
        got = last[0] or {}
        raise AssertionError(
            f"served counts {got.get('counts')} events {got.get('events')}, replay counts "
            f"{reference['counts']} events {reference['events']}"
        ) from None


def checkpoint_then_finish(
    coordinator: Running, codec: EventCodec, checkpoints: int, principal: str
) -> str:
    agent = coordinator.agent(codec, configuration=PERIODIC)
    with coordinator.client() as client:
        answer = client.patch(
            f"/jobs/{agent.job_id}/checkpoints/configuration",
            json={"checkpointTimeout": 45_000},
            headers={"X-Sparkpoint-Principal": principal},
        )
        assert answer.status_code == 200, answer.text
    agent.wait_for(lambda: len(agent.completed) >= checkpoints, what=f"{checkpoints} checkpoints")
    agent.finish()
    wait(lambda: agent.job_id not in coordinator.service.jobs, what="job ended")
    agent.stop()
    return agent.job_id


def test_the_history_equals_a_replay_and_survives_a_restart_from_its_changelog(
    kafka: KafkaUnderTest, tmp_path: Path, codec: EventCodec, history: HistoryProcess
) -> None:
    with contextlib.contextmanager(coordinator_in_thread)(kafka, tmp_path) as coordinator:
        history.start().wait_ready()
        first = checkpoint_then_finish(coordinator, codec, 5, "sre@example.com")
        reference = replayed(kafka.bootstrap, codec, first)
        wait_equal(history, reference)

        history.kill()  # SIGKILL: nothing is flushed or committed on the way out
        second = checkpoint_then_finish(coordinator, codec, 3, "oncall@example.com")
        history.start()
        history.wait_ready()
        # served at once from the recovered table, before anything new was folded
        recovered = served(history, first)
        assert recovered is not None and comparable(recovered) == comparable(reference)
        wait_equal(history, replayed(kafka.bootstrap, codec, second))
        status = history.status() or {}
        total = reference["events"] + replayed(kafka.bootstrap, codec, second)["events"]
        assert status["folded"] < total, "the restarted service replayed the audit topics"

    overview = {j["sparkpoint.job_id"]: j for j in history.get("/jobs/overview").json()["jobs"]}
    assert overview[first]["state"] == "FINISHED"
    assert overview[first]["sparkpoint.checkpoints"] == reference["counts"]["completed"] >= 5
    changes = history.get(f"/jobs/{first}/config-changes").json()["changes"]
    assert [c["principal"] for c in changes] == ["sre@example.com"]
    assert changes[0]["new"]["checkpoint_timeout_ms"] == 45_000
    by_jid = history.get(f"/jobs/{overview[first]['jid']}/checkpoints")
    assert by_jid.json()["counts"]["completed"] == reference["counts"]["completed"]
    assert history.get("/jobs/no-such-job/checkpoints").status_code == 404
    assert history.get(f"/jobs/{first}/checkpoints", before_epoch="x").status_code == 400


def test_after_a_coordinator_failover_the_new_owner_answers_the_whole_history(
    kafka: KafkaUnderTest, tmp_path: Path, codec: EventCodec, history: HistoryProcess
) -> None:
    history.start().wait_ready()
    running = contextlib.contextmanager(coordinator_in_thread)
    with running(kafka, tmp_path) as first:
        agent = first.agent(codec, configuration=PERIODIC)
        agent.wait_for(lambda: len(agent.completed) >= 4, what="checkpoints under the first owner")
        before = first.service.job(agent.job_id).core.stats.completed
    with running(kafka, tmp_path, history_url=history.url) as second:
        wait(lambda: agent.job_id in second.service.jobs, what="the job taken over")
        done = len(agent.completed)
        agent.wait_for(lambda: len(agent.completed) >= done + 3, what="checkpoints after it")
        wait(
            lambda: (
                (served(history, agent.job_id) or {}).get("counts", {}).get("completed", 0)
                >= before
            ),
            what="the history service caught up",
        )
        own = second.service.job(agent.job_id).core.stats.to_json()
        with second.client() as client:
            merged: dict[str, Any] = client.get(f"/jobs/{agent.job_id}/checkpoints").json()
        agent.finish()
        wait(lambda: agent.job_id not in second.service.jobs, what="job ended")
        agent.stop()
    reference = replayed(kafka.bootstrap, codec, agent.job_id)
    wait_equal(history, reference)  # the history spans both owners, as a replay does
    epochs = sorted(int(e) for e in reference["epochs"])
    assert len(epochs) == 2, f"one ownership epoch per coordinator, got {epochs}"
    assert reference["epochs"][str(epochs[0])]["completed"] >= before
    # the new owner counted only its own; with the history service it answers both
    assert before > 0 and own["counts"]["completed"] < merged["counts"]["completed"]
    assert merged["counts"]["completed"] >= own["counts"]["completed"] + before
    assert merged["counts"]["completed"] <= reference["counts"]["completed"]
    ids = [e["id"] for e in merged["history"]]
    assert ids == sorted(ids, reverse=True)
    assert any(i < min(e["id"] for e in own["history"]) for i in ids), "the first owner's"


def test_audit_reads_the_history_service_and_follows_new_events(
    kafka: KafkaUnderTest, codec: EventCodec, history: HistoryProcess
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    now = int(time.time() * 1000)
    change = replace(config_change(), job_id=job, changed_at=now)
    triggered = CheckpointLifecycleEvent(job, 1, 1, CheckpointEventType.TRIGGERED, SnapshotType.CHECKPOINT, now)  # fmt: skip
    done = replace(triggered, event_type=CheckpointEventType.COMPLETED, timestamp=now + 50,
                   duration_ms=50, state_size_bytes=10, external_path="file:///cp/chk-1")  # fmt: skip
    publisher.publish_sync(CONFIG_CHANGES, job, change)
    hostile = make_producer(kafka.bootstrap)  # bytes that are no event, between good ones
    hostile.produce(CHECKPOINT_EVENTS.name(), key=job.encode(), value=b"\xc3\x01 not avro")
    hostile.flush(10)
    for event in (triggered, done):
        publisher.publish_sync(CHECKPOINT_EVENTS, job, event)
    history.start().wait_ready()
    wait(lambda: (served(history, job) or {}).get("events") == 3, what="folded")
    assert (history.status() or {})["malformed"] == 1, "the bad record is counted and skipped"

    from_history: list[str] = []
    assert audit.run(kafka.bootstrap, job, None, False, from_history.append, history.url) == 2
    replayed_lines: list[str] = []
    audit.run(kafka.bootstrap, job, None, False, replayed_lines.append)
    config_line = next(line for line in replayed_lines if " config " in line)
    assert config_line in from_history, "the same words for a change, whichever the source"
    assert any(
        "checkpoint 1 COMPLETED after 50 ms at file:///cp/chk-1" in line for line in from_history
    )
    assert not any("TRIGGERED" in line for line in from_history), "the history lists final states"

    followed: list[str] = []
    stop = threading.Event()
    follower = threading.Thread(
        target=audit.follow, args=(kafka.bootstrap, job, False, followed.append, stop.is_set)
    )
    follower.start()
    try:
        time.sleep(1.0)  # assigned at the end offsets
        later = replace(triggered, checkpoint_id=2, timestamp=int(time.time() * 1000) + 1)
        publisher.publish_sync(CHECKPOINT_EVENTS, job, later)
        wait(lambda: any("checkpoint 2 TRIGGERED" in line for line in followed), what="followed")
    finally:
        stop.set()
        follower.join(10)
        publisher.close()
    assert not any("checkpoint 1 " in line for line in followed), "what was written before"


def test_aiokafka_does_not_go_back_to_an_offset_of_0_or_none(
    kafka: KafkaUnderTest, new_topic: Callable[..., str]
) -> None:
    """Why the history service's consumer rewinds by itself (`RewindingConsumer`), on any broker:
    faust drops fetched records when it stops the flow and goes back with ``seek_to_committed``,
    which leaves the position alone where the committed offset is missing or 0."""
    topic = new_topic()
    producer = make_producer(kafka.bootstrap, one_record_per_batch=True)
    for n in range(3):
        producer.produce(topic, value=str(n).encode())
    producer.flush(10)

    async def positions() -> list[int]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap, group_id=f"rewind-{uuid.uuid4().hex[:8]}",
            enable_auto_commit=False, auto_offset_reset="earliest",
        )  # fmt: skip
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            for _ in range(30):
                if await consumer.position(tp) == 3:
                    break
                await consumer.getmany(tp, timeout_ms=1000)
            seen = []
            for committed in (None, 0, 1):
                if committed is not None:
                    await consumer.commit({tp: committed})
                await consumer.seek_to_committed()
                seen.append(await consumer.position(tp))
            return seen
        finally:
            await consumer.stop()

    assert asyncio.run(positions()) == [3, 3, 1]


# --- the embedded broker's defects, as they meet faust (aiokafka) -------------------------------


def test_aiokafka_cannot_be_idempotent_on_the_embedded_broker(
    embedded_only: KafkaUnderTest,
) -> None:
    """Why the history service runs faust's at-least-once guarantee and folds idempotently: an
    idempotent (or transactional) aiokafka producer fails its InitProducerId request here."""

    async def start_idempotent() -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=embedded_only.bootstrap, enable_idempotence=True
        )
        try:
            await asyncio.wait_for(producer.start(), 20)
        finally:
            await producer.stop()

    with pytest.raises(aiokafka.errors.KafkaError):
        asyncio.run(start_idempotent())


def test_aiokafka_batches_of_several_records_end_where_the_embedded_broker_says_they_begin(
    embedded_only: KafkaUnderTest, new_topic: Any
) -> None:
    """The embedded broker reports a partition's end as its last batch's base offset + 1, and
    faust's recovery reads a changelog to that end: a changelog whose last batch held several
    records would come back without the rest of that batch."""
    topic = new_topic()

    async def burst() -> list[int]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=embedded_only.bootstrap, linger_ms=50
        )
        await producer.start()
        try:
            sent = [await producer.send(topic, b"v", key=b"k%d" % i) for i in range(5)]
            return [(await s).offset for s in sent]
        finally:
            await producer.stop()

    assert asyncio.run(burst()) == [0, 1, 2, 3, 4]
    reported, true_ends = end_offsets_of(embedded_only.bootstrap, topic)
    assert (reported[0], true_ends[0]) == (1, 5)


def test_every_changelog_record_is_a_batch_of_its_own_and_recovered_whole(
    kafka: KafkaUnderTest, codec: EventCodec, history: HistoryProcess
) -> None:
    """The work-around for the defect above: the history service writes each document in a
    produce request of its own, even when one batch of events changed several documents."""
    jobs = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(8)]
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    history.start().wait_ready()
    for job in jobs:  # one burst: folded in one batch
        publisher.publish_nowait(JOBS, job, replace(job_registered(job), job_name=job))
    publisher.flush()
    publisher.close()
    wait(lambda: all(served(history, j) is not None for j in jobs), what="every job folded")
    reported, true_ends = end_offsets_of(kafka.bootstrap, f"{history.group}-jobs-changelog")
    assert reported == true_ends and sum(true_ends.values()) >= len(jobs)

    time.sleep(3.5)  # faust commits what it folded every 2.8 s
    history.kill()
    history.start().wait_ready()
    assert all(served(history, j) is not None for j in jobs), "documents lost in recovery"
    assert (history.status() or {})["folded"] == 0, "recovered from the changelog, not refolded"


def end_offsets_of(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    consumer = make_consumer(bootstrap)
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        reported = {p: end_offsets(consumer, topic)[p][1] for p in partitions}
        return reported, {p: true_end_offset(consumer, topic, p) for p in partitions}
    finally:
        consumer.close()
