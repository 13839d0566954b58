"""The history service (`sparkpoint history`, faust) against real coordinators on the session's
broker: its documents equal a full replay of the audit topics, after a restart of the service
(recovered from its table's changelog) and across a coordinator failover."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.avro import EventCodec
from services.common.kafka import make_admin, replay_topic
from services.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES, JOBS, create_topics
from services.history import model
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.running_history import HistoryProcess

PERIODIC = {"execution.checkpointing.interval": "100ms"}


@pytest.fixture
def history(kafka: KafkaUnderTest, topic_prefix: str, tmp_path: Path) -> Iterator[HistoryProcess]:
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    process = HistoryProcess(kafka.bootstrap, tmp_path)
    try:
        yield process
    finally:
        process.kill()


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
        agent.stop()
    reference = replayed(kafka.bootstrap, codec, agent.job_id)
    epochs = sorted(int(e) for e in reference["epochs"])
    assert len(epochs) == 2, f"one ownership epoch per coordinator, got {epochs}"
    assert reference["epochs"][str(epochs[0])]["completed"] >= before
    # the new owner counted only its own; with the history service it answers both
    assert own["counts"]["completed"] < before + own["counts"]["completed"]
    assert merged["counts"]["completed"] >= own["counts"]["completed"] + before
    assert merged["counts"]["completed"] <= reference["counts"]["completed"]
    ids = [e["id"] for e in merged["history"]]
    assert ids == sorted(ids, reverse=True)
    assert any(i < min(e["id"] for e in own["history"]) for i in ids), "the first owner's"
