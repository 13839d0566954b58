"""`sparkpoint audit` against a real secured history service (`sparkpoint history` over https on
the session's broker, as test_history_security starts it): a read token (from its file or its
variable) reads the history; without one the history named with --history fails in one line
naming the flag, and the default history service is said on stderr and the topics replayed;
under mutual TLS a client certificate reads, none or an untrusted CA is said in one line. No
run shows a token or a traceback."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointEventType, CheckpointLifecycleEvent, SnapshotType
from sparkpoint.common.kafka import EventPublisher, make_producer
from sparkpoint.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES
from sparkpoint.coordinator.service.earlier import TOKEN_ENV
from tests.conftest import KafkaUnderTest
from tests.factories import config_change
from tests.integration.test_history_security import TOKENS, serve_secured
from tests.integration.test_history_service import served
from tests.rest_tls import READ_TOKEN, Pki, write_access_list
from tests.running_coordinator import wait
from tests.running_history import SPARKPOINT, HistoryProcess

pytestmark = pytest.mark.integration

COMPLETED = "checkpoint 1 COMPLETED after 50 ms at file:///cp/chk-1"
"""How audit words the completed checkpoint, from the history service or from a replay."""
REPLAYED = "checkpoint 1 TRIGGERED"
"""Only a replay lists triggers: the history service keeps final states."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@dataclass
class Audit:
    """`sparkpoint audit` as a user runs it, against one job's audit trail; every run is kept
    to be searched for tokens at the end."""

    bootstrap: str
    job: str
    token_file: Path
    runs: list[subprocess.CompletedProcess[str]]

    def __call__(
        self, *flags: str, job: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        command = [SPARKPOINT, "audit", *([self.job] if job else []), "--bootstrap", self.bootstrap]
        environment = {
            k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "SPARKPOINT_HISTORY_URL")
        }
        done = subprocess.run(
            [*command, *flags], capture_output=True, text=True, timeout=120, check=False,
            env=environment | (env or {}),
        )  # fmt: skip
        self.runs.append(done)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def showed_no_token(self, history: HistoryProcess) -> None:
        assert self.runs
        for token in TOKENS:
            for done in self.runs:
                assert token not in done.stdout and token not in done.stderr
            assert token not in history.log()


@pytest.fixture
def audit(
    kafka: KafkaUnderTest, codec: EventCodec, history: HistoryProcess, tmp_path: Path
) -> Audit:
    """One job's audit trail (a configuration change, checkpoint 1 triggered and completed) on
    the test's topics, and the read token in a file."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    now = int(time.time() * 1000)
    triggered = CheckpointLifecycleEvent(job, 1, 1, CheckpointEventType.TRIGGERED, SnapshotType.CHECKPOINT, now)  # fmt: skip
    done = replace(triggered, event_type=CheckpointEventType.COMPLETED, timestamp=now + 50,
                   duration_ms=50, state_size_bytes=10, external_path="file:///cp/chk-1")  # fmt: skip
    try:
        publisher.publish_sync(
            CONFIG_CHANGES, job, replace(config_change(), job_id=job, changed_at=now)
        )
        for event in (triggered, done):
            publisher.publish_sync(CHECKPOINT_EVENTS, job, event)
    finally:
        publisher.close()
    token_file = tmp_path / "history-token"
    token_file.write_text(READ_TOKEN + "\n")
    return Audit(kafka.bootstrap, job, token_file, [])


def folded(history: HistoryProcess, job: str) -> None:
    """Waits until the secured service has folded the job's three events (read with the token)."""
    history.token = READ_TOKEN
    wait(lambda: (served(history, job) or {}).get("events") == 3, what="folded")
    history.token = None


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_read_token_from_its_file_or_its_variable_reads_the_history_service(
    history: HistoryProcess, pki: Pki, tmp_path: Path, audit: Audit
) -> None:
    serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
    folded(history, audit.job)
    trust = ["--history", history.url, "--history-ca", str(pki.ca_file)]
    for read in (
        audit(*trust, "--history-token-file", str(audit.token_file)),
        audit(*trust, env={TOKEN_ENV: READ_TOKEN}),
        audit(*trust, "--history-token-file", str(audit.token_file), job=False),
    ):
        assert read.returncode == 0, read.stderr
        assert COMPLETED in read.stdout and "sre@example.com changed" in read.stdout
        assert REPLAYED not in read.stdout, "from the history service, not a replay"
        assert read.stderr == ""
    audit.showed_no_token(history)


def test_without_a_token_the_history_named_with_history_fails_in_one_line(
    history: HistoryProcess, pki: Pki, tmp_path: Path, audit: Audit
) -> None:
    serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
    trust = ["--history", history.url, "--history-ca", str(pki.ca_file)]
    for refused, path in ((audit(*trust), f"/jobs/{audit.job}/history"),
                          (audit(*trust, job=False), "/jobs/overview")):  # fmt: skip
        assert refused.returncode == 1 and refused.stdout == ""
        line = one_line(refused.stderr)
        assert line.startswith(
            f"sparkpoint: the history service at {history.url} answered GET {path} with HTTP 401"
        )
        assert "HTTP 401" in line and "--history-token-file" in line, line
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-a-token-of-the-list")
    invalid = audit(*trust, "--history-token-file", str(wrong))
    assert invalid.returncode == 1 and "the bearer token is not valid" in one_line(invalid.stderr)
    audit.showed_no_token(history)


def test_without_a_token_the_default_history_is_said_and_the_topics_are_replayed(
    history: HistoryProcess, pki: Pki, tmp_path: Path, audit: Audit
) -> None:
    """The default history service ($SPARKPOINT_HISTORY_URL here, else http://127.0.0.1:8082)
    refusing: one line on stderr, then the replay's full story, exit 0."""
    serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
    replayed = audit("--history-ca", str(pki.ca_file), env={"SPARKPOINT_HISTORY_URL": history.url})
    assert replayed.returncode == 0, replayed.stderr
    line = one_line(replayed.stderr)
    assert "HTTP 401" in line and "--history-token-file" in line
    assert line.endswith("; replaying the topics instead")
    assert REPLAYED in replayed.stdout and COMPLETED in replayed.stdout
    assert "fate of each checkpoint" in replayed.stdout
    audit.showed_no_token(history)


def test_under_mutual_tls_a_client_certificate_reads_and_none_is_said_in_one_line(
    history: HistoryProcess, pki: Pki, tmp_path: Path, audit: Audit
) -> None:
    access = write_access_list(
        tmp_path / "access.json",
        certificates={"oncall": "read", "test-harness": "read"},
        **{"certificate-default-role": "none"},
    )
    serve_secured(history, pki, access, mutual=True)
    folded(history, audit.job)
    cert, key = pki.client("oncall")
    trust = ["--history", history.url, "--history-ca", str(pki.ca_file)]
    read = audit(*trust, "--history-cert", str(cert), "--history-key", str(key))
    assert read.returncode == 0, read.stderr
    assert COMPLETED in read.stdout and REPLAYED not in read.stdout

    no_certificate = audit(*trust)
    assert no_certificate.returncode == 1 and no_certificate.stdout == ""
    assert "--history-cert" in one_line(no_certificate.stderr)
    stranger_cert, stranger_key = pki.client("stranger")
    stranger = audit(
        *trust, "--history-cert", str(stranger_cert), "--history-key", str(stranger_key)
    )
    line = one_line(stranger.stderr)
    assert stranger.returncode == 1 and "HTTP 403" in line and "'stranger' is not admitted" in line
    untrusted = audit(
        "--history", history.url, "--history-cert", str(cert), "--history-key", str(key)
    )
    assert untrusted.returncode == 1
    assert "certificate is not trusted" in one_line(untrusted.stderr)
    assert "--history-ca" in untrusted.stderr
    missing = audit(*trust, "--history-cert", str(tmp_path / "missing.pem"))
    assert missing.returncode == 1
    assert f"--history-cert {tmp_path / 'missing.pem'}: no such file" in one_line(missing.stderr)
    audit.showed_no_token(history)
