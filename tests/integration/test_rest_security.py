"""The coordinator's REST API secured, against real coordinators serving https on the session's
broker: bearer tokens with the read and operate roles, the audited principal that a spoofed
header cannot change, a token revoked by editing the access list, mutual TLS with the
certificate's CN as the principal, secrets redacted from the job's configuration, and no
configured token in any answer."""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import ConfigChange
from sparkpoint.common.kafka import ConsumerProfile, EventSubscriber, make_consumer
from sparkpoint.common.redaction import REDACTED
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.topics import CONFIG_CHANGES
from tests.conftest import KafkaUnderTest
from tests.rest_tls import (
    OPERATE_TOKEN,
    READ_TOKEN,
    Pki,
    Secured,
    secured_coordinator,
    write_access_list,
)
from tests.running_coordinator import wait
from tests.scripted_agent import ScriptedAgent

pytestmark = pytest.mark.integration

ANSWERS: list[str] = []
"""Every answer's headers and body in this module, searched for the tokens at the end."""


def answered(response: httpx.Response) -> httpx.Response:
    ANSWERS.append(f"{response.headers}\n{response.text}")
    return response


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tokens(
    kafka: KafkaUnderTest, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    """TLS and bearer tokens (no client certificates)."""
    root = tmp_path_factory.mktemp("tokens")
    access = write_access_list(root / "access.json")
    security = RestSecurity(pki.server_cert, pki.server_key, access_file=access)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from secured_coordinator(kafka, root, pki, security)


@pytest.fixture(scope="module")
def mutual(
    kafka: KafkaUnderTest, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    """Mutual TLS: ``oncall`` reads, every other certificate of the CA operates."""
    root = tmp_path_factory.mktemp("mutual")
    access = write_access_list(root / "access.json", certificates={"oncall": "read"})
    security = RestSecurity(pki.server_cert, pki.server_key, pki.ca_file, access)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from secured_coordinator(kafka, root, pki, security)


def job(coordinator: Secured, codec: EventCodec, **configuration: str) -> ScriptedAgent:
    agent = ScriptedAgent(
        coordinator.bootstrap, codec, f"job-{uuid.uuid4().hex[:8]}",
        configuration=dict(configuration), state_dir=coordinator.root,
    )  # fmt: skip
    agent.start()
    wait(lambda: agent.job_id in coordinator.service.jobs, what=f"{agent.job_id} registered")
    return agent


def config_changes(coordinator: Secured, codec: EventCodec, job_id: str) -> list[ConfigChange]:
    subscriber = EventSubscriber(
        make_consumer(coordinator.bootstrap, profile=ConsumerProfile.REPLAY), codec
    )
    topic = CONFIG_CHANGES.name()
    partitions = subscriber.consumer.list_topics(topic, timeout=10).topics[topic].partitions
    subscriber.assign([TopicPartition(topic, p, 0) for p in partitions])
    found: list[ConfigChange] = []
    deadline = time.monotonic() + 15
    while not found and time.monotonic() < deadline:
        found += [
            r.event
            for r in subscriber.poll(0.2)
            if isinstance(r.event, ConfigChange) and r.event.job_id == job_id
        ]
    subscriber.close()
    return found


# bearer tokens


def test_a_request_without_a_token_is_refused_401_in_flinks_error_shape(tokens: Secured) -> None:
    with tokens.https() as client:
        refused = answered(client.get("/jobs"))
        wrong = answered(client.get("/jobs", headers={"Authorization": "Bearer not-a-token"}))
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert list(refused.json()) == ["errors"] and "Bearer" in refused.json()["errors"][0]
    assert wrong.status_code == 401 and "invalid_token" in wrong.headers["www-authenticate"]


def test_a_read_token_reads_but_cannot_operate(tokens: Secured, codec: EventCodec) -> None:
    agent = job(tokens, codec)
    base = f"/jobs/{agent.job_id}"
    try:
        with tokens.https(token=READ_TOKEN) as client:
            for path in ("/jobs", base, f"{base}/checkpoints", f"{base}/config", "/metrics"):
                assert answered(client.get(path)).status_code == 200, path
            refused = [
                answered(client.patch(f"{base}/checkpoints/configuration", json={"checkpointInterval": 5000})),
                answered(client.post(f"{base}/checkpoints", json={})),
                answered(client.post(f"{base}/savepoints", json={})),
                answered(client.post(f"{base}/stop", json={})),
                answered(client.patch(base, params={"mode": "cancel"})),
                answered(client.post("/savepoint-disposal", json={"savepoint-path": "/x"})),
            ]  # fmt: skip
        for answer in refused:
            assert answer.status_code == 403, answer.text
            assert answer.json()["errors"][0].startswith("grafana has the read role;")
            assert "needs the operate role" in answer.json()["errors"][0]
        assert agent.triggers == [] and agent.cancels == []
    finally:
        agent.stop()


def test_an_operate_token_changes_the_configuration_audited_as_its_principal(
    tokens: Secured, codec: EventCodec
) -> None:
    agent = job(tokens, codec)
    try:
        with tokens.https(token=OPERATE_TOKEN) as client:
            changed = answered(
                client.patch(
                    f"/jobs/{agent.job_id}/checkpoints/configuration",
                    json={"checkpointInterval": 3_600_000},
                    headers={"X-Sparkpoint-Principal": "spoofed-admin"},
                )
            )
        assert changed.status_code == 200, changed.text
        (change,) = config_changes(tokens, codec, agent.job_id)
        assert change.principal == "alice"
    finally:
        agent.stop()


def test_the_dashboard_page_loads_without_a_token_and_its_data_needs_one(
    tokens: Secured,
) -> None:
    with tokens.https() as client:
        page = answered(client.get("/"))
        metrics = answered(client.get("/metrics"))
    assert page.status_code == 200 and "sessionStorage" in page.text
    assert "Authorization" in page.text
    assert metrics.status_code == 401


def test_plain_http_is_not_answered_on_the_https_port(tokens: Secured) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(tokens.url.replace("https://", "http://") + "/jobs", timeout=5)


def test_a_token_removed_from_the_access_list_is_refused_without_a_restart(
    kafka: KafkaUnderTest, pki: Pki, tmp_path: Path
) -> None:
    access = write_access_list(tmp_path / "access.json")
    security = RestSecurity(pki.server_cert, pki.server_key, access_file=access)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        running = secured_coordinator(kafka, tmp_path, pki, security)
        coordinator = next(running)
        try:
            with coordinator.https(token=READ_TOKEN) as client:
                assert answered(client.get("/jobs")).status_code == 200
                listed = json.loads(access.read_text())
                listed["tokens"] = [t for t in listed["tokens"] if t["principal"] != "grafana"]
                access.write_text(json.dumps(listed))
                assert answered(client.get("/jobs")).status_code == 401
                access.write_text("tokens: [unclosed")  # a broken edit refuses everyone
                assert answered(client.get("/jobs")).status_code == 503
                access.write_text("")  # emptied (`: > access.json`): broken too, not empty
                emptied = answered(client.get("/jobs"))
                assert emptied.status_code == 503, emptied.text
            with coordinator.https(token=OPERATE_TOKEN) as client:
                assert answered(client.get("/jobs")).status_code == 503
                write_access_list(access)
                assert answered(client.get("/jobs")).status_code == 200
        finally:
            next(running, None)


def test_secret_options_of_a_job_are_redacted_in_its_configuration(
    tokens: Secured, codec: EventCodec
) -> None:
    agent = job(
        tokens,
        codec,
        **{"sasl.password": "kafka-password-value", "execution.checkpointing.interval": "1h"},
    )
    try:
        with tokens.https(token=READ_TOKEN) as client:
            config = answered(client.get(f"/jobs/{agent.job_id}/config"))
            jobmanager = answered(client.get("/jobmanager/config"))
        user_config = config.json()["execution-config"]["user-config"]
        assert user_config["sasl.password"] == REDACTED
        assert user_config["execution.checkpointing.interval"] == "1h"
        assert "kafka-password-value" not in config.text
        assert jobmanager.status_code == 200 and jobmanager.json()
    finally:
        agent.stop()


# mutual TLS


def test_a_client_without_a_certificate_cannot_connect(mutual: Secured) -> None:
    with mutual.https() as client, pytest.raises(httpx.HTTPError):
        client.get("/jobs")


def test_a_certificate_from_another_ca_cannot_connect(mutual: Secured, tmp_path: Path) -> None:
    stranger = Pki(tmp_path)
    context = ssl.create_default_context(cafile=str(mutual.pki.ca_file if mutual.pki else ""))
    context.load_cert_chain(*stranger.client("ci-pipeline"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{mutual.url}/jobs", verify=context, timeout=5)


def test_a_trusted_certificate_is_its_cn_principal_and_has_its_role(
    mutual: Secured, codec: EventCodec
) -> None:
    agent = job(mutual, codec)
    try:
        with mutual.https("oncall") as oncall:
            assert answered(oncall.get(f"/jobs/{agent.job_id}")).status_code == 200
            refused = answered(oncall.patch(f"/jobs/{agent.job_id}", params={"mode": "cancel"}))
        assert refused.status_code == 403
        assert refused.json()["errors"][0].startswith("oncall has the read role")
        with mutual.https("ci-pipeline") as ci:
            cancelled = answered(
                ci.patch(
                    f"/jobs/{agent.job_id}",
                    params={"mode": "cancel"},
                    headers={"X-Sparkpoint-Principal": "spoofed-admin"},
                )
            )
        assert cancelled.status_code == 202, cancelled.text
        agent.wait_for(lambda: len(agent.cancels) == 1, what="the cancellation")
        assert agent.cancels[0].requested_by == "ci-pipeline"
    finally:
        agent.stop()


def test_an_emptied_access_list_lets_no_certificate_operate(
    mutual: Secured, codec: EventCodec
) -> None:
    """Emptied, the list would have left every certificate the default role, operate: it is a
    broken file instead, every request refused (503) until it lists again."""
    access = mutual.root / "access.json"
    kept = access.read_text()
    agent = job(mutual, codec)
    try:
        access.write_text("# every grant revoked\n")
        with mutual.https("oncall") as oncall:
            refused = answered(oncall.patch(f"/jobs/{agent.job_id}", params={"mode": "cancel"}))
            assert refused.status_code == 503, refused.text
            access.write_text(kept)
            assert answered(oncall.get(f"/jobs/{agent.job_id}")).status_code == 200
        assert agent.cancels == []
    finally:
        access.write_text(kept)
        agent.stop()


def test_a_token_names_the_principal_over_mutual_tls_too(
    mutual: Secured, codec: EventCodec
) -> None:
    agent = job(mutual, codec)
    try:
        with mutual.https("oncall", token=OPERATE_TOKEN) as client:
            changed = answered(
                client.patch(
                    f"/jobs/{agent.job_id}/checkpoints/configuration",
                    json={"checkpointTimeout": 60_000},
                )
            )
        assert changed.status_code == 200, changed.text
        (change,) = config_changes(mutual, codec, agent.job_id)
        assert change.principal == "alice"
    finally:
        agent.stop()


def test_no_answer_of_this_module_contains_a_configured_token() -> None:
    assert len(ANSWERS) >= 20
    for text in ANSWERS:
        assert OPERATE_TOKEN not in text and READ_TOKEN not in text
