"""The `sparkpoint` command against a secured coordinator, run as a user runs it: ``sparkpoint
coordinator`` serving https with an access list, the REST commands with a token (flag, file or
environment) and a CA, refused without them and for a role that may not operate; mutual TLS with
a client certificate; bad security settings refused before anything starts. No token appears in
anything the commands or the coordinator print."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import free_port
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.topics import create_topics
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

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")
PRINTED: list[str] = []
"""Everything the commands and the coordinator printed, searched for the tokens at the end."""


def sparkpoint(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKPOINT_REST", "KAFKA_"))}
    done = subprocess.run(
        [SPARKPOINT, *args], capture_output=True, text=True, timeout=120, check=False,
        env=clean | env,
    )  # fmt: skip
    PRINTED.append(done.stdout + done.stderr)
    return done


@dataclass
class CoordinatorProcess:
    url: str
    pki: Pki
    job_id: str
    log: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, pki: Pki, tmp_path_factory: pytest.TempPathFactory, codec: EventCodec
) -> Iterator[CoordinatorProcess]:
    """``sparkpoint coordinator`` with TLS and an access list, and a job registered with it."""
    root = tmp_path_factory.mktemp("coordinator")
    access = write_access_list(root / "access.json")
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", prefix)
        create_topics(make_admin(kafka.bootstrap), partitions=2)
        log = (root / "coordinator.log").open("w")
        process = subprocess.Popen(
            [
                SPARKPOINT, "coordinator", "--bootstrap", kafka.bootstrap,
                "--rest-port", str(port), "--rest-tls-cert", str(pki.server_cert),
                "--rest-tls-key", str(pki.server_key), "--rest-access-file", str(access),
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=root,
            env=dict(os.environ, SPARKPOINT_TOPIC_PREFIX=prefix),
        )  # fmt: skip
        url = f"https://127.0.0.1:{port}"
        agent = ScriptedAgent(kafka.bootstrap, codec, f"job-{uuid.uuid4().hex[:8]}", state_dir=root)
        try:
            wait(lambda: _answers(url, pki), 60, "the coordinator's https")
            agent.start()
            with httpx.Client(verify=pki.context(), headers=_bearer(READ_TOKEN)) as client:
                wait(lambda: client.get(f"{url}/jobs/{agent.job_id}").status_code == 200, 60,
                     "the job registered")  # fmt: skip
            yield CoordinatorProcess(url, pki, agent.job_id, root / "coordinator.log")
        finally:
            agent.stop()
            process.send_signal(signal.SIGTERM)
            process.wait(30)
            log.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _answers(url: str, pki: Pki) -> bool:
    try:
        return httpx.get(f"{url}/", verify=pki.context(), timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_rest_commands_without_a_token_are_told_how_to_give_one(
    coordinator: CoordinatorProcess,
) -> None:
    done = sparkpoint("jobs", "--rest", coordinator.url, "--rest-ca", str(coordinator.pki.ca_file))
    assert done.returncode == 1
    assert "authentication required" in done.stderr and "--rest-token" in done.stderr


def test_rest_commands_with_a_token_and_the_ca_work(coordinator: CoordinatorProcess) -> None:
    ca = str(coordinator.pki.ca_file)
    by_flag = sparkpoint("jobs", "--rest", coordinator.url, "--rest-ca", ca, "--rest-token", READ_TOKEN)  # fmt: skip
    assert by_flag.returncode == 0, by_flag.stderr
    assert coordinator.job_id in by_flag.stdout
    by_env = sparkpoint(
        "checkpoints", coordinator.job_id, SPARKPOINT_REST=coordinator.url,
        SPARKPOINT_REST_CA=ca, SPARKPOINT_REST_TOKEN=READ_TOKEN,
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    assert f"job {coordinator.job_id}: " in by_env.stdout


def test_a_read_token_cannot_change_the_configuration_an_operate_token_can(
    coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    ca = str(coordinator.pki.ca_file)
    common = ("config", coordinator.job_id, "--interval", "1h", "--rest", coordinator.url, "--rest-ca", ca)  # fmt: skip
    refused = sparkpoint(*common, "--rest-token", READ_TOKEN)
    assert refused.returncode == 1
    assert "grafana has the read role" in refused.stderr and "HTTP 403" in refused.stderr
    token_file = tmp_path / "token"
    token_file.write_text(OPERATE_TOKEN + "\n")
    changed = sparkpoint(*common, "--rest-token-file", str(token_file))
    assert changed.returncode == 0, changed.stderr
    assert "interval: 3600000" in changed.stdout


def test_an_untrusted_coordinator_certificate_is_said_so(coordinator: CoordinatorProcess) -> None:
    done = sparkpoint("jobs", "--rest", coordinator.url, "--rest-token", READ_TOKEN)
    assert done.returncode == 1
    assert "certificate is not trusted" in done.stderr and "--rest-ca" in done.stderr


@pytest.fixture(scope="module")
def mutual(kafka: KafkaUnderTest, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:  # fmt: skip
    root = tmp_path_factory.mktemp("mutual")
    security = RestSecurity(pki.server_cert, pki.server_key, pki.ca_file)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"e2e{uuid.uuid4().hex[:8]}.")
        yield from secured_coordinator(kafka, root, pki, security)


def test_mutual_tls_needs_the_client_certificate(mutual: Secured, pki: Pki) -> None:
    ca = str(pki.ca_file)
    refused = sparkpoint("jobs", "--rest", mutual.url, "--rest-ca", ca)
    assert refused.returncode == 1
    assert "TLS refused" in refused.stderr and "--rest-cert" in refused.stderr
    cert, key = pki.client("ci-pipeline")
    listed = sparkpoint(
        "jobs", "--rest", mutual.url, "--rest-ca", ca, "--rest-cert", str(cert),
        "--rest-key", str(key),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("id ")


def test_bad_security_settings_are_refused_naming_the_file(tmp_path: Path, pki: Pki) -> None:
    missing = sparkpoint(
        "coordinator", "--rest-tls-cert", str(tmp_path / "nope.pem"),
        "--rest-tls-key", str(pki.server_key),
    )  # fmt: skip
    assert missing.returncode == 2
    assert f"{tmp_path / 'nope.pem'}: no such file" in missing.stderr
    broken = tmp_path / "access.yaml"
    broken.write_text("tokens:\n  - principal: alice\n    role: admin\n    sha256: " + "0" * 64)
    malformed = sparkpoint("coordinator", "--rest-access-file", str(broken))
    assert malformed.returncode == 2
    assert f"{broken}: tokens entry 1: role 'admin' is neither read nor operate" in malformed.stderr
    client = sparkpoint("jobs", "--rest", "https://127.0.0.1:1", "--rest-ca", str(tmp_path / "ca"))
    assert client.returncode == 1 and f"--rest-ca {tmp_path / 'ca'}: no such file" in client.stderr


def test_nothing_printed_holds_a_token(coordinator: CoordinatorProcess) -> None:
    printed = coordinator.log.read_text()
    assert "REST security: TLS; bearer tokens from" in printed
    assert len(PRINTED) >= 8
    for text in [*PRINTED, printed]:
        assert OPERATE_TOKEN not in text and READ_TOKEN not in text
