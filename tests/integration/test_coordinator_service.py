"""The coordinator service on the real broker with scripted agents: the FLIP-571 test plan,
REST validation, statistics, savepoints, audit topics and bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointFailureReason, CheckpointLifecycleEvent, ConfigChange
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventSubscriber,
    make_consumer,
    make_producer,
)
from sparkpoint.common.topics import ACKS, CHECKPOINT_EVENTS, CONFIG_CHANGES, JOBS
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import Action, Answer, always


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """One coordinator for the module (jobs have unique ids): a group join costs ~3 s here."""
    tmp_path = tmp_path_factory.mktemp("coordinator")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path)


def periodic(interval: str = "300ms", timeout: str = "10s", **more: str) -> dict[str, str]:
    return {
        "execution.checkpointing.interval": interval,
        "execution.checkpointing.timeout": timeout,
        **more,
    }


# --- checkpoints complete -------------------------------------------------------------------------


def test_periodic_checkpoints_complete_with_metadata(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, configuration=periodic())
    agent.wait_for(lambda: len(agent.completed) >= 3, what="three completed checkpoints")
    agent.stop()

    done = agent.completed[0]
    retained = coordinator.service.jobs[agent.job_id].core.store.latest()
    assert retained is not None and (Path(retained.external_path) / "_metadata").is_file()
    # num-retained is 1: the first checkpoint was subsumed and its directory discarded
    wait(lambda: not Path(done.external_path).exists(), what="subsumed checkpoint discarded")
    with coordinator.client() as client:
        stats = client.get(f"/jobs/{agent.job_id}/checkpoints").json()
        details = client.get(f"/jobs/{agent.job_id}/checkpoints/details/{done.checkpoint_id}")
        jobs = client.get("/jobs").json()["jobs"]
    assert stats["counts"]["completed"] >= 3
    assert stats["latest"]["completed"]["num_acknowledged_subtasks"] == 2
    assert [s["status"] for s in details.json()["subtasks"]] == ["completed", "completed"]
    assert {
        "id": agent.job_id,
        "jid": flink_job_id(agent.job_id),
        "name": f"scripted {agent.job_id}",
        "status": "RUNNING",
        "parallelism": 2,
        "restarts": 0,
    } in jobs


def test_a_manual_checkpoint_is_answered_with_its_id(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, configuration={})
    with coordinator.client() as client:
        bad = client.post(f"/jobs/{agent.job_id}/checkpoints", json={"checkpointType": "SOME"})
        full = {"checkpointType": "FULL"}
        request_id = client.post(f"/jobs/{agent.job_id}/checkpoints", json=full).json()[
            "request-id"
        ]
        wait(
            lambda: (
                client.get(f"/jobs/{agent.job_id}/checkpoints/{request_id}").json()["status"]["id"]
                == "COMPLETED"
            )
        )
        answer = client.get(f"/jobs/{agent.job_id}/checkpoints/{request_id}").json()
    # COMPLETED on REST precedes the notification's arrival at the agent
    agent.wait_for(lambda: bool(agent.completed), what="the completion notification")
    agent.stop()
    assert bad.status_code == 400 and "checkpointType" in bad.json()["errors"][0]
    assert answer["operation"]["checkpointId"] == agent.completed[0].checkpoint_id
    assert agent.triggers[0].snapshot_type.name == "FULL_CHECKPOINT"


# --- FLIP-571 ------------------------------------------------------------------------------------------


def test_a_patch_takes_effect_and_get_config_reflects_it(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, configuration=periodic(interval="1h"))
    with coordinator.client() as client:
        response = client.patch(
            f"/jobs/{agent.job_id}/checkpoints/configuration",
            json={"checkpointInterval": 200, "checkpointTimeout": 30_000},
            headers={"X-Sparkpoint-Principal": "sre@example.com", "X-Request-Id": "req-42"},
        )
        config = client.get(f"/jobs/{agent.job_id}/checkpoints/config").json()
    assert response.status_code == 200, response.text
    assert (
        response.json()["interval"] == 200
        and config["interval"] == 200
        and config["timeout"] == 30_000
    )
    agent.wait_for(lambda: len(agent.completed) >= 3, what="checkpoints at the new interval")
    agent.stop()

    changes = replay(coordinator, codec, CONFIG_CHANGES.name())
    (change,) = [c for c in changes if isinstance(c, ConfigChange) and c.job_id == agent.job_id]
    assert (change.principal, change.request_id) == ("sre@example.com", "req-42")
    assert (change.old.checkpoint_interval_ms, change.new.checkpoint_interval_ms) == (
        3_600_000,
        200,
    )
    assert sorted(change.changed_fields) == ["checkpointInterval", "checkpointTimeout"]


def test_an_extended_timeout_saves_an_in_flight_checkpoint(
    coordinator: Running, codec: EventCodec
) -> None:
    slow_last = lambda trigger, subtask: Answer(Action.ACK, 2.5 if subtask == "keyed-1" else 0.0)  # noqa: E731
    agent = coordinator.agent(
        codec, configuration=periodic(interval="1h", timeout="1500ms"), script=slow_last
    )
    with coordinator.client() as client:
        client.post(f"/jobs/{agent.job_id}/checkpoints")
        agent.wait_for(lambda: agent.triggers, what="a trigger")
        triggered_at = time.monotonic()
        time.sleep(0.8)
        assert (
            client.patch(
                f"/jobs/{agent.job_id}/checkpoints/configuration",
                json={"checkpointTimeout": 10_000},
            ).status_code
            == 200
        )
    agent.wait_for(lambda: agent.completed, what="completion after the old deadline")
    completed_after = time.monotonic() - triggered_at
    agent.stop()
    assert completed_after > 1.5  # past the old deadline
    assert agent.aborted == []


def test_a_reduced_timeout_aborts_a_checkpoint_at_once(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(
        codec,
        configuration=periodic(interval="1h", timeout="10min"),
        script=always(Answer(Action.HANG)),
    )
    with coordinator.client() as client:
        client.post(f"/jobs/{agent.job_id}/checkpoints")
        agent.wait_for(lambda: agent.triggers, what="a trigger")
        time.sleep(0.6)
        patched = time.monotonic()
        assert (
            client.patch(
                f"/jobs/{agent.job_id}/checkpoints/configuration", json={"checkpointTimeout": 500}
            ).status_code
            == 200
        )
    agent.wait_for(lambda: agent.aborted, what="abort")
    agent.stop()
    assert agent.aborted[0].reason is CheckpointFailureReason.CHECKPOINT_EXPIRED
    assert time.monotonic() - patched < 5


def test_concurrent_updates_one_succeeds_the_others_get_409(
    coordinator: Running, codec: EventCodec, kafka: KafkaUnderTest
) -> None:
    if kafka.embedded is None:
        pytest.skip("holds the first update in flight by pausing the embedded broker")
    agent = coordinator.agent(codec, configuration=periodic(interval="1h"))
    job = coordinator.service.jobs[agent.job_id]
    path = f"/jobs/{agent.job_id}/checkpoints/configuration"

    async def updates() -> tuple[int, list[int]]:
        async with httpx.AsyncClient(base_url=coordinator.url, timeout=30) as client:
            kafka.embedded.pause()  # type: ignore[union-attr]
            try:
                first = asyncio.create_task(client.patch(path, json={"checkpointInterval": 1000}))
                while not job.updating:  # persisting to the paused broker: in progress
                    await asyncio.sleep(0.005)
                others = await asyncio.gather(
                    *(client.patch(path, json={"checkpointInterval": 2000 + i}) for i in range(7))
                )
            finally:
                kafka.embedded.resume()  # type: ignore[union-attr]
            return (await first).status_code, [r.status_code for r in others]

    first, others = asyncio.run(updates())
    with coordinator.client() as client:
        interval = client.get(f"/jobs/{agent.job_id}/checkpoints/config").json()["interval"]
    agent.stop()
    assert first == 200
    assert others == [409] * 7
    assert interval == 1000


def test_a_declining_agent_gets_aborts_and_a_failover_request(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(
        codec,
        configuration=periodic(
            interval="200ms", **{"execution.checkpointing.tolerable-failed-checkpoints": "1"}
        ),
        script=lambda trigger, subtask: Answer(
            Action.DECLINE if subtask == "keyed-1" else Action.ACK
        ),
    )
    agent.wait_for(lambda: agent.failovers, what="a failover request")
    agent.stop()
    assert {a.reason for a in agent.aborted} == {CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION}
    assert agent.failovers[0].consecutive_failures == 2
    assert agent.completed == []


def test_a_crashed_agent_s_checkpoints_expire(coordinator: Running, codec: EventCodec) -> None:
    agent = coordinator.agent(
        codec,
        configuration=periodic(interval="1h", timeout="300ms"),
        script=lambda trigger, subtask: Answer(
            Action.CRASH if subtask == "keyed-1" else Action.ACK
        ),
    )
    with coordinator.client() as client:
        request_id = client.post(f"/jobs/{agent.job_id}/checkpoints").json()["request-id"]
        wait(
            lambda: (
                client.get(f"/jobs/{agent.job_id}/checkpoints/{request_id}").json()["status"]["id"]
                == "COMPLETED"
            )
        )
        answer = client.get(f"/jobs/{agent.job_id}/checkpoints/{request_id}").json()
        stats = client.get(f"/jobs/{agent.job_id}/checkpoints").json()
    agent.stop()
    assert "CHECKPOINT_EXPIRED" in answer["operation"]["failure-cause"]["stack-trace"]
    assert (
        stats["counts"]["failed"] == 1
        and stats["latest"]["failed"]["num_acknowledged_subtasks"] == 1
    )


# --- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"checkpointIntervall": 1000}, "checkpointIntervall"),
        ({"checkpointInterval": "10s"}, "checkpointInterval"),
        ({"checkpointInterval": True}, "checkpointInterval"),
        ({"checkpointInterval": 0}, "checkpointInterval"),
        ({"checkpointTimeout": -5}, "checkpointTimeout"),
        ({"minPauseBetweenCheckpoints": -1}, "minPauseBetweenCheckpoints"),
        ({"maxConcurrentCheckpoints": 0}, "maxConcurrentCheckpoints"),
        ({"tolerableCheckpointFailureNumber": -1}, "tolerableCheckpointFailureNumber"),
        ({"alignedCheckpointTimeout": 1.5}, "alignedCheckpointTimeout"),
    ],
)
def test_invalid_updates_are_400_naming_the_field(
    coordinator: Running, codec: EventCodec, body: dict[str, object], field: str
) -> None:
    agent = coordinator.agent(codec, configuration=periodic(interval="1h"))
    with coordinator.client() as client:
        response = client.patch(f"/jobs/{agent.job_id}/checkpoints/configuration", json=body)
        config = client.get(f"/jobs/{agent.job_id}/checkpoints/config").json()
    agent.stop()
    assert response.status_code == 400
    assert field in response.json()["errors"][0]
    assert config["interval"] == 3_600_000  # nothing changed


def test_max_concurrent_above_one_with_unaligned_is_400(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(
        codec,
        configuration=periodic(
            interval="1h", **{"execution.checkpointing.unaligned.enabled": "true"}
        ),
    )
    with coordinator.client() as client:
        response = client.patch(
            f"/jobs/{agent.job_id}/checkpoints/configuration", json={"maxConcurrentCheckpoints": 2}
        )
    agent.stop()
    assert response.status_code == 400
    assert "maxConcurrentCheckpoints" in response.json()["errors"][0]


def test_unknown_jobs_are_404(coordinator: Running) -> None:
    with coordinator.client() as client:
        for method, path in [("GET", "/jobs/nope/checkpoints"), ("GET", "/jobs/nope/checkpoints/config"),
                             ("PATCH", "/jobs/nope/checkpoints/configuration"), ("POST", "/jobs/nope/savepoints")]:  # fmt: skip
            response = client.request(method, path, json={} if method != "GET" else None)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["errors"]


# --- savepoints ------------------------------------------------------------------------------------------


def test_a_savepoint_completes_and_is_listed_after_the_job_ended(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, configuration={})
    target = str(coordinator.root / "savepoints" / "manual")
    with coordinator.client() as client:
        request_id = client.post(
            f"/jobs/{agent.job_id}/savepoints", json={"target-directory": target}
        ).json()["request-id"]
        wait(
            lambda: (
                client.get(f"/jobs/{agent.job_id}/savepoints/{request_id}").json()["status"]["id"]
                == "COMPLETED"
            )
        )
        location = client.get(f"/jobs/{agent.job_id}/savepoints/{request_id}").json()["operation"][
            "location"
        ]
        default_id = client.post(f"/jobs/{agent.job_id}/savepoints", json={}).json()["request-id"]
        wait(
            lambda: (
                client.get(f"/jobs/{agent.job_id}/savepoints/{default_id}").json()["status"]["id"]
                == "COMPLETED"
            )
        )
        agent.finish()
        wait(lambda: agent.job_id not in coordinator.service.jobs, what="job ended")
        listed = client.get(f"/jobs/{agent.job_id}/savepoints").json()["savepoints"]
    agent.stop()
    assert location.startswith(f"{target}/savepoint-{agent.job_id[:6]}-")
    assert (Path(location) / "_metadata").is_file()
    # both, wherever they were written: the job's record lists every savepoint it wrote
    assert next(s["location"] for s in listed) == location and len(listed) == 2
    assert all(s["exists"] and s["kind"] == "manual" for s in listed)


def test_a_finished_job_leaves_a_tombstone_for_its_overrides(
    coordinator: Running, codec: EventCodec
) -> None:
    from sparkpoint.overrides.store import OverrideStore

    finishing, staying = (
        coordinator.agent(codec, configuration=periodic(interval="1h")) for _ in range(2)
    )
    with coordinator.client() as client:
        for agent in (finishing, staying):
            assert (
                client.patch(
                    f"/jobs/{agent.job_id}/checkpoints/configuration",
                    json={"checkpointInterval": 7000},
                ).status_code
                == 200
            )
    finishing.finish()
    wait(lambda: finishing.job_id not in coordinator.service.jobs, what="job ended")
    for agent in (finishing, staying):
        agent.stop()

    def replayed() -> dict[str, object]:
        return dict(OverrideStore(coordinator.bootstrap, codec).replay())

    wait(lambda: finishing.job_id not in replayed(), what="tombstone")
    assert replayed()[staying.job_id].overrides.checkpoint_interval_ms == 7000  # type: ignore[attr-defined]


def test_a_savepoint_directory_outside_the_roots_is_400(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, configuration={})
    with coordinator.client() as client:
        response = client.post(
            f"/jobs/{agent.job_id}/savepoints", json={"target-directory": "/etc/evil"}
        )
    agent.stop()
    assert response.status_code == 400
    assert "target-directory" in response.json()["errors"][0]


# --- audit, metrics, openapi ------------------------------------------------------------------------------


def test_lifecycle_events_and_metrics(coordinator: Running, codec: EventCodec) -> None:
    agent = coordinator.agent(
        codec,
        configuration=periodic(
            interval="200ms",
            timeout="400ms",  # tolerated: an expiry must not fail the job over (no triggers then)
            **{"execution.checkpointing.tolerable-failed-checkpoints": "3"},
        ),
        script=lambda t, s: Answer(Action.HANG if t.checkpoint_id == 2 else Action.ACK),
    )
    agent.wait_for(
        lambda: len(agent.completed) >= 2 and agent.aborted, what="completions and an expiry"
    )
    with coordinator.client() as client:
        metrics = client.get("/metrics").text
        openapi = client.get("/openapi.json").json()
        dashboard = client.get("/")
    agent.stop()
    events = [
        e
        for e in replay(coordinator, codec, CHECKPOINT_EVENTS.name())
        if isinstance(e, CheckpointLifecycleEvent) and e.job_id == agent.job_id
    ]
    kinds = {(e.checkpoint_id, e.event_type.name) for e in events}
    assert {(1, "TRIGGERED"), (1, "COMPLETED"), (2, "TRIGGERED"), (2, "EXPIRED")} <= kinds
    assert f'flink_jobmanager_job_numberOfCompletedCheckpoints{{job_id="{agent.job_id}"' in metrics
    assert "flink_jobmanager_job_lastCheckpointDuration" in metrics
    assert "/jobs/{jobid}/checkpoints/configuration" in openapi["paths"]
    assert dashboard.status_code == 200 and dashboard.headers["content-type"].startswith(
        "text/html"
    )
    assert "fetch('/jobs')" in dashboard.text and "<svg" in dashboard.text


# --- bad input ---------------------------------------------------------------------------------------------


def test_bad_input_is_skipped_and_the_service_carries_on(
    coordinator: Running, codec: EventCodec
) -> None:
    malformed_before = coordinator.service.malformed
    agent = coordinator.agent(
        codec, configuration=periodic(interval="300ms"), script=always(Answer(Action.ACK_TWICE))
    )
    raw = make_producer(coordinator.bootstrap)
    for topic in (ACKS.name(), JOBS.name()):
        raw.produce(topic, key=agent.job_id.encode(), value=b"\x00garbage")
    raw.produce(
        ACKS.name(),
        key=b"job-that-does-not-exist",
        value=codec.encode(_ack("job-that-does-not-exist")),
    )
    raw.produce(
        ACKS.name(),
        key=agent.job_id.encode(),
        value=codec.encode(_ack(agent.job_id, subtask="keyed-77")),
    )
    raw.flush(10)
    agent.wait_for(lambda: len(agent.completed) >= 3, what="checkpoints despite bad input")
    agent.stop()
    assert coordinator.service.malformed >= malformed_before + 2


def _ack(job_id: str, subtask: str = "keyed-0") -> object:
    from sparkpoint.common.events import AcknowledgeCheckpoint

    return AcknowledgeCheckpoint(job_id, 1, subtask, 0, 0, [], 0, 0, 0, 0, 0, False)


def replay(running: Running, codec: EventCodec, topic: str) -> list[object]:
    subscriber = EventSubscriber(
        make_consumer(running.bootstrap, profile=ConsumerProfile.REPLAY), codec
    )
    from confluent_kafka import TopicPartition

    events: list[object] = []
    metadata = subscriber.consumer.list_topics(topic, timeout=10).topics[topic]
    subscriber.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        events.extend(r.event for r in subscriber.poll(0.2))
    subscriber.close()
    return events


# --- the sparkpoint command against the running coordinator ------------------------------------------

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def sparkpoint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SPARKPOINT, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_operates_a_job_and_audits_it(coordinator: Running, codec: EventCodec) -> None:
    agent = coordinator.agent(codec, configuration=periodic(interval="1h"))
    rest = ["--rest", coordinator.url]
    try:
        jobs = sparkpoint("jobs", *rest)
        config = sparkpoint(
            "config", agent.job_id, *rest, "--timeout", "45s", "--min-pause", "100ms"
        )
        shown = sparkpoint("config", agent.job_id, *rest)
        checkpoint = sparkpoint("checkpoint", agent.job_id, *rest)
        savepoint = sparkpoint("savepoint", agent.job_id, *rest)
        history = sparkpoint("checkpoints", agent.job_id, *rest)
    finally:
        agent.stop()
    audit = sparkpoint("audit", agent.job_id, "--bootstrap", coordinator.bootstrap)
    audit_json = sparkpoint(
        "audit", agent.job_id, "--bootstrap", coordinator.bootstrap, "--json", "--since", "1h"
    )

    for result in (jobs, config, shown, checkpoint, savepoint, history, audit, audit_json):
        assert result.returncode == 0, result.stderr
    assert agent.job_id in jobs.stdout
    assert "timeout: 45000" in config.stdout and "min_pause: 100" in shown.stdout
    assert checkpoint.stdout.strip().endswith("/chk-1")
    assert f"/savepoint-{agent.job_id[:6]}-" in savepoint.stdout
    assert "COMPLETED" in history.stdout
    assert (
        "changed checkpointTimeout 10000 -> 45000, minPauseBetweenCheckpoints 0 -> 100"
        in audit.stdout
    )
    assert "checkpoint 1 COMPLETED" in audit.stdout and "savepoint 2 COMPLETED" in audit.stdout
    assert "fate of each checkpoint" in audit.stdout
    records = [json.loads(line) for line in audit_json.stdout.splitlines()]
    assert {r["type"] for r in records} == {"ConfigChange", "CheckpointLifecycleEvent"}


def test_cli_errors_are_one_line_and_exit_1(coordinator: Running) -> None:
    result = sparkpoint("config", "no-such-job", "--rest", coordinator.url, "--timeout", "10s")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "no-such-job not found" in result.stderr


def test_cli_bad_durations_are_usage_errors() -> None:
    result = sparkpoint("config", "job", "--timeout", "soon")
    assert result.returncode == 2
    assert "--timeout" in result.stderr
