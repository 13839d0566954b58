"""What Flink's own tools need of the REST API, against a live coordinator: JobIDs,
``/v1/`` paths, cancel, the dashboard's files and requests, forwarding for Flink's clients, and
every Flink-shaped answer carrying the fields a real Flink 2.3 answers with (the samples in
tests/data/flink-2.3/, recorded by tests/compat/record_flink_samples.py)."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobStatus
from sparkpoint.common.flink_ids import flink_job_id, is_flink_id
from sparkpoint.coordinator.rest.flink_compat import WebUi
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import ScriptedAgent

SAMPLES = json.loads(
    (Path(__file__).parents[1] / "data" / "flink-2.3" / "rest-samples.json").read_text()
)["responses"]


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    web = tmp_path_factory.mktemp("web")
    (web / "index.html").write_text("<html><base href='./'><body>dashboard</body></html>")
    (web / "main.js").write_text("console.log('flink')")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(
            kafka, tmp_path_factory.mktemp("flink-rest"), web_ui=WebUi.load(web)
        )


@pytest.fixture(scope="module")
def job(coordinator: Running, codec: EventCodec) -> Iterator[ScriptedAgent]:
    """A running job with a completed checkpoint and savepoint."""
    agent = coordinator.agent(codec)
    with coordinator.client() as client:
        base = f"/jobs/{agent.job_id}"
        trigger = client.post(f"{base}/savepoints", json={}).json()["request-id"]
        wait(
            lambda: (
                client.get(f"{base}/savepoints/{trigger}").json()["status"]["id"] == "COMPLETED"
            ),
            what="a savepoint",
        )
    yield agent
    agent.stop()


def fields(sample: Any, ours: Any, where: str = "") -> list[str]:
    """The fields of a Flink sample that our answer lacks, recursively (lists: their first
    elements; a map keyed by data, such as timestamps by state, is compared by its shape)."""
    missing: list[str] = []
    if isinstance(sample, dict) and isinstance(ours, dict):
        for key, value in sample.items():
            if key not in ours:
                missing.append(f"{where}.{key}")
            else:
                missing += fields(value, ours[key], f"{where}.{key}")
    elif isinstance(sample, list) and isinstance(ours, list) and sample and ours:
        missing += fields(sample[0], ours[0], f"{where}[0]")
    elif sample is None or ours is None:
        pass  # null where there is nothing yet (no completed checkpoint, say): either is fine
    elif isinstance(sample, dict) != isinstance(ours, dict) or isinstance(
        sample, list
    ) != isinstance(ours, list):
        missing.append(f"{where}: {type(ours).__name__} where Flink has {type(sample).__name__}")
    return missing


# Fields of Flink's answers that describe what sparkpoint has no counterpart of: they are left
# out, each for the reason given.
NO_COUNTERPART: set[str] = set()


@pytest.mark.parametrize(
    ("sample", "path"),
    [
        ("GET /config", "/config"),
        ("GET /overview", "/overview"),
        ("GET /jobs/overview", "/jobs/overview"),
        ("GET /jobs/{jid}", "/jobs/{jid}"),
        ("GET /jobs/{jid}/exceptions", "/jobs/{jid}/exceptions"),
        ("GET /jobs/{jid}/config", "/jobs/{jid}/config"),
        ("GET /jobs/{jid}/checkpoints/config", "/jobs/{jid}/checkpoints/config"),
        ("GET /jobs/{jid}/checkpoints", "/jobs/{jid}/checkpoints"),
        ("GET /jobs/{jid}/plan", "/jobs/{jid}/plan"),
        ("GET /taskmanagers", "/taskmanagers"),
        ("GET /jobmanager/config", "/jobmanager/config"),
        ("GET /applications/overview", "/applications/overview"),
    ],
)
def test_answers_carry_every_field_flink_2_3_answers_with(
    coordinator: Running, job: ScriptedAgent, sample: str, path: str
) -> None:
    jid = flink_job_id(job.job_id)
    with coordinator.client() as client:
        answer = client.get(f"/v1{path.replace('{jid}', jid)}")
    assert answer.status_code == SAMPLES[sample]["status"] == 200, answer.text
    missing = [f for f in fields(SAMPLES[sample]["body"], answer.json()) if f not in NO_COUNTERPART]
    assert missing == [], f"{path}: Flink 2.3 has {missing}"


def test_a_job_has_a_stable_flink_job_id_and_every_path_takes_it_or_the_job_id(
    coordinator: Running, job: ScriptedAgent
) -> None:
    jid = flink_job_id(job.job_id)
    assert is_flink_id(jid) and jid == jid.lower() and jid != job.job_id
    assert flink_job_id(job.job_id) == jid  # derived, nothing stored
    with coordinator.client() as client:
        listed = client.get("/jobs").json()["jobs"]
        assert [j["jid"] for j in listed if j["id"] == job.job_id] == [jid]
        overview = client.get("/v1/jobs/overview").json()["jobs"]
        assert [(j["jid"], j["sparkpoint"]["job_id"]) for j in overview] == [(jid, job.job_id)]
        by_jid = client.get(f"/v1/jobs/{jid}/checkpoints").json()
        by_name = client.get(f"/jobs/{job.job_id}/checkpoints").json()
        assert by_jid["counts"] == by_name["counts"] and by_jid["counts"]["completed"] >= 1
        assert client.get(f"/jobs/{jid.upper()}").json()["jid"] == jid  # either case
        assert client.get(f"/v1/jobs/{'f' * 32}").status_code == 404


def test_a_job_id_of_32_hex_digits_is_its_own_flink_job_id(
    coordinator: Running, codec: EventCodec
) -> None:
    job_id = uuid.uuid4().hex
    agent = ScriptedAgent(coordinator.bootstrap, codec, job_id, state_dir=coordinator.root)
    agent.start()
    try:
        wait(lambda: job_id in coordinator.service.jobs, what="registered")
        with coordinator.client() as client:
            details = client.get(f"/v1/jobs/{job_id}").json()
        assert details["jid"] == job_id and details["sparkpoint"]["job_id"] == job_id
    finally:
        agent.stop()


def test_versioned_paths_answer_as_the_plain_ones(coordinator: Running, job: ScriptedAgent) -> None:
    with coordinator.client() as client:
        for path in ("/jobs", "/config", f"/jobs/{job.job_id}/checkpoints/config"):
            plain, versioned = client.get(path), client.get(f"/v1{path}")
            assert (versioned.status_code, versioned.json()) == (plain.status_code, plain.json())
        assert client.get("/v2/jobs").status_code == 404


def test_the_dashboard_is_served_under_flink_and_its_relative_requests_reach_the_api(
    coordinator: Running, job: ScriptedAgent
) -> None:
    jid = flink_job_id(job.job_id)
    with coordinator.client() as client:
        assert client.get("/flink").headers["location"] == "/flink/"
        index = client.get("/flink/")
        assert index.status_code == 200 and "dashboard" in index.text
        assert index.headers["content-type"].startswith("text/html")
        assert "javascript" in client.get("/flink/main.js").headers["content-type"]
        assert client.get("/flink/jobs/overview").json()["jobs"][0]["jid"] == jid
        assert client.get(f"/flink/jobs/{jid}/checkpoints").json()["counts"]["completed"] >= 1
        assert client.get("/flink/no-such-file.js").status_code == 404


def test_cancel_asks_the_agent_to_end_the_job_canceled(
    coordinator: Running, codec: EventCodec
) -> None:
    agent = coordinator.agent(codec, end_on_cancel=True)
    jid = flink_job_id(agent.job_id)
    try:
        with coordinator.client() as client:
            refused = client.patch(f"/v1/jobs/{jid}", params={"mode": "stop"})
            assert refused.status_code == 400 and refused.json()["errors"][0].startswith("mode:")
            assert agent.cancels == []
            accepted = client.patch(
                f"/v1/jobs/{jid}",
                params={"mode": "cancel"},
                headers={"X-Sparkpoint-Principal": "alice"},
            )
            assert (accepted.status_code, accepted.json()) == (202, {})
            agent.wait_for(lambda: len(agent.cancels) == 1, what="the cancellation")
            cancel = agent.cancels[0]
            assert (cancel.agent_id, cancel.attempt, cancel.requested_by) == (
                agent.agent_id,
                agent.attempt,
                "alice",
            )
            wait(
                lambda: client.get(f"/jobs/{jid}").json()["state"] == JobStatus.CANCELED.name,
                what="CANCELED",
            )
            again = client.patch(f"/jobs/{jid}")
            assert again.status_code == 409 and "CANCELED" in again.json()["errors"][0]
    finally:
        agent.stop()


class Owner(http.server.BaseHTTPRequestHandler):
    """Another instance, as far as forwarding goes: answers every request with what it got."""

    seen: ClassVar[list[tuple[str, str, str | None, bytes]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        Owner.seen.append((self.command, self.path, self.headers.get(FORWARDED), body))
        answer = json.dumps({"request-id": "from-the-owner"}).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


FORWARDED = "X-Sparkpoint-Forwarded"


def test_flink_clients_get_the_owners_answer_others_a_redirect(
    coordinator: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flink's REST client follows no redirect: a /v1/ request for a job another instance owns
    is forwarded there once (never again from there) and its answer returned."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Owner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    owner = f"http://127.0.0.1:{server.server_address[1]}"
    elsewhere = flink_job_id("owned-elsewhere")
    monkeypatch.setattr(
        coordinator.service,
        "route",
        lambda job_id, tried=(): (owner, 1) if job_id == elsewhere and 1 not in tried else None,
    )
    try:
        with coordinator.client() as client:
            body = {"target-directory": None, "cancel-job": False}
            forwarded = client.post(f"/v1/jobs/{elsewhere}/savepoints", json=body)
            assert (forwarded.status_code, forwarded.json()) == (
                202,
                {"request-id": "from-the-owner"},
            )
            method, path, header, sent = Owner.seen[-1]
            assert (method, path, header) == ("POST", f"/v1/jobs/{elsewhere}/savepoints", "1")
            assert json.loads(sent) == body
            redirected = client.post(f"/jobs/{elsewhere}/savepoints", json=body)
            assert redirected.status_code == 307
            assert redirected.headers["location"] == (
                f"{owner}/jobs/{elsewhere}/savepoints?sparkpoint-hop=1"
            )
            # a forwarded request or a redirect hop that tried the only partition: answered here
            again = client.post(
                f"/v1/jobs/{elsewhere}/savepoints", json=body, headers={FORWARDED: "1"}
            )
            hop = client.post(f"/jobs/{elsewhere}/savepoints?sparkpoint-hop=1", json=body)
            assert again.status_code == hop.status_code == 404
            assert len(Owner.seen) == 1
    finally:
        server.shutdown()


def test_an_unreachable_owner_is_a_503_naming_it(
    coordinator: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        coordinator.service, "route", lambda job_id, tried=(): ("http://127.0.0.1:9", 0)
    )
    with httpx.Client(base_url=coordinator.url, timeout=40) as client:
        answer = client.get(f"/v1/jobs/{flink_job_id('gone')}")
    assert answer.status_code == 503 and "http://127.0.0.1:9" in answer.json()["errors"][0]


def test_sparkpoint_jobs_shows_the_job_id_and_the_flink_job_id(
    coordinator: Running, job: ScriptedAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkpoint.cli import main

    assert main(["jobs", "--rest", coordinator.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "Flink JobID" in lines[0]
    assert any(line.split()[:2] == [job.job_id, flink_job_id(job.job_id)] for line in lines[1:])


def test_sparkpoint_cancel_cancels_as_flink_cancel_does(
    coordinator: Running, codec: EventCodec, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkpoint.cli import main

    agent = coordinator.agent(codec, end_on_cancel=True)
    try:
        assert main(["cancel", flink_job_id(agent.job_id), "--rest", coordinator.url]) == 0
        assert "CANCELED" in capsys.readouterr().out
        agent.wait_for(lambda: len(agent.cancels) == 1, what="the cancellation")
        wait(lambda: agent.job_id in coordinator.service.ended, what="the job ended")
        assert coordinator.service.ended[agent.job_id].status is JobStatus.CANCELED
        assert main(["cancel", agent.job_id, "--rest", coordinator.url]) == 1  # 409: ended
        assert "already reached another terminal state" in capsys.readouterr().err
    finally:
        agent.stop()


@pytest.mark.parametrize(
    ("drain", "kind"), [(False, "SAVEPOINT_SUSPEND"), (True, "SAVEPOINT_TERMINATE")]
)
def test_sparkpoint_stop_suspends_or_with_drain_terminates_as_flink_stop(
    coordinator: Running,
    codec: EventCodec,
    capsys: pytest.CaptureFixture[str],
    drain: bool,
    kind: str,
) -> None:
    from sparkpoint.cli import main

    agent = coordinator.agent(codec)
    try:
        argv = ["stop", flink_job_id(agent.job_id), "--rest", coordinator.url, "--timeout", "60"]
        assert main(argv + (["--drain"] if drain else [])) == 0
        trigger = agent.triggers[-1]  # acknowledged, so heard before the stop completed
        assert trigger.snapshot_type.name == kind
        assert capsys.readouterr().out.strip() == trigger.target_location
    finally:
        agent.stop()
