"""Two real coordinator instances sharing the jobs' partitions: Flink's clients, which follow no
redirect, get the owning instance's answer from either; a JobID is routed by itself (no instance
needs to have seen the job); a JobID nobody knows is answered 404 without a loop. The caller's
bearer token goes with a forwarded request, never from an https instance to a plain-http one."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.rest_security import RestSecurity
from tests.conftest import KafkaUnderTest
from tests.rest_tls import OPERATE_TOKEN, Pki, secured_coordinator, write_access_list
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


class PlainOwner(http.server.BaseHTTPRequestHandler):
    """An instance announced on plain http: records the Authorization header of what it gets."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        PlainOwner.seen.append(self.headers.get("Authorization"))
        answer = json.dumps({"jid": "from-the-owner"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def plain_owner() -> Iterator[str]:
    PlainOwner.seen.clear()
    server = http.server.HTTPServer(("127.0.0.1", 0), PlainOwner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def owned_by(owner: str, jid: str) -> Any:
    """A `route` that names ``owner`` for ``jid`` (partition 1), no one else."""
    return lambda job_id, tried=(): (owner, 1) if job_id == jid and 1 not in tried else None


def test_an_https_instance_refuses_to_forward_credentials_to_a_plain_http_owner(
    kafka: KafkaUnderTest, plain_owner: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = Pki(tmp_path)
    security = RestSecurity(
        pki.server_cert, pki.server_key, access_file=write_access_list(tmp_path / "access.json")
    )
    monkeypatch.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
    running = secured_coordinator(kafka, tmp_path, pki, security)
    here = next(running)
    jid = flink_job_id("owned-on-plain-http")
    monkeypatch.setattr(here.service, "route", owned_by(plain_owner, jid))
    try:
        with here.https(token=OPERATE_TOKEN) as client:
            answer = client.get(f"/v1/jobs/{jid}")
        assert answer.status_code == 503, answer.text
        (message,) = answer.json()["errors"]
        assert f"({plain_owner})" in message
        assert "refusing to forward credentials over plain http" in message
        assert PlainOwner.seen == []
    finally:
        next(running, None)


def test_between_plain_http_instances_the_token_is_forwarded_as_the_operator_chose(
    pair: tuple[Running, Running], plain_owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, _ = pair
    jid = flink_job_id("owned-on-plain-http")
    monkeypatch.setattr(here.service, "route", owned_by(plain_owner, jid))
    with here.client() as client:
        answer = client.get(f"/v1/jobs/{jid}", headers={"Authorization": "Bearer plain-token"})
    assert (answer.status_code, answer.json()) == (200, {"jid": "from-the-owner"})
    assert PlainOwner.seen == ["Bearer plain-token"]
