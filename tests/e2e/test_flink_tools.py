"""Flink's own tools drive sparkpoint: the real Flink 2.3 CLI from the `apache-flink`
package lists, savepoints, disposes, stops with a savepoint and cancels the example job's agent
(on the session's Spark) through the coordinator's REST; the job restarts from the CLI's
savepoint; Flink's web dashboard, served by the coordinator, loads every page in headless
Chromium without a failed request.

Flink's CLI over TLS: with ``security.ssl.rest.*`` (PKCS12 keystore and truststore) it lists,
savepoints and cancels against a coordinator with mutual TLS, as its certificate's principal; a
certificate with the read role is refused (403, shown by the CLI); a bearer token sent through
``FLINK_REST_CLIENT_HEADERS`` names the principal; the web UI is served over mutual TLS.

Skipped, saying so, when the `apache-flink` package is absent (844 MB, not a dependency):
``make compat`` installs it into .venv-compat (with Playwright) and runs this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.agent.example import generate, payments, reference_output
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobStatus
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.coordinator.rest.flink_compat import WebUi
from tests.agent_jobs import build
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import difference, read_output
from tests.rest_tls import OPERATE_TOKEN, Pki, Secured, secured_coordinator, write_access_list
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import ScriptedAgent

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / ".venv-compat"
RECORDS = 3_000


def flink_home() -> Path | None:
    """``$FLINK_HOME``, else the pyflink folder of .venv-compat (``make compat``)."""
    candidates = [Path(os.environ["FLINK_HOME"])] if os.environ.get("FLINK_HOME") else []
    candidates += sorted(COMPAT.glob("lib/python3*/site-packages/pyflink"))
    return next((c for c in candidates if (c / "bin" / "flink").is_file()), None)


HOME = flink_home()
if HOME is None:
    pytest.skip(
        "the apache-flink package is absent (844 MB, not a dependency): `make compat` installs "
        "it into .venv-compat and runs these tests",
        allow_module_level=True,
    )
if shutil.which("java") is None:
    pytest.skip("Flink's CLI needs java on the PATH", allow_module_level=True)


@dataclass
class Flink:
    """The real ``flink`` command, against the coordinator's REST address; ``conf``: a
    configuration folder (FLINK_CONF_DIR) instead of the package's, ``env``: more variables."""

    home: Path
    address: str
    conf: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: str) -> str:
        done = self.run(*args)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"flink {' '.join(args)}:\n{out[-3000:]}"
        return out

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        java = Path(shutil.which("java") or "java").resolve().parents[1]
        env = dict(os.environ, JAVA_HOME=str(java), **self.env)
        if self.conf is not None:
            env["FLINK_CONF_DIR"] = str(self.conf)
        return subprocess.run(
            [str(self.home / "bin" / "flink"), args[0], "-m", self.address, *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )


def flink_dist(home: Path) -> Path:
    return next(home.glob("lib/flink-dist-*.jar"))


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    assert HOME is not None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(
            kafka, tmp_path_factory.mktemp("flink-tools"), web_ui=WebUi.load(flink_dist(HOME))
        )


@dataclass
class AgentThread:
    agent: Agent
    thread: threading.Thread
    result: list[JobStatus]

    def ended(self) -> JobStatus:
        self.thread.join(120)
        assert not self.thread.is_alive(), "the agent did not end"
        return self.result[0]


def start(job: Any, coordinator: Running, spark: Any, restore: str | None = None) -> AgentThread:
    options = AgentOptions(
        coordinator.bootstrap, checkpoint_dir=str(coordinator.root / "checkpoints"), restore=restore
    )
    agent = Agent(job, options, EventCodec(), spark=spark)
    result: list[JobStatus] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()), daemon=True)
    thread.start()
    return AgentThread(agent, thread, result)


def state(coordinator: Running, jid: str) -> str:
    with coordinator.client() as client:
        return str(client.get(f"/v1/jobs/{jid}").json().get("state"))


def completed(coordinator: Running, jid: str) -> int:
    with coordinator.client() as client:
        return int(client.get(f"/v1/jobs/{jid}/checkpoints").json()["counts"]["completed"])


def saved_path(out: str) -> Path:
    found = re.search(r"Savepoint completed\. Path: (\S+)", out)
    assert found, out
    return Path(found.group(1).removeprefix("file:"))


def test_the_flink_cli_lists_savepoints_disposes_stops_and_cancels_a_sparkpoint_job(
    coordinator: Running, kafka: KafkaUnderTest, spark: Any
) -> None:
    assert HOME is not None
    topic, output = f"payments-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, topic, RECORDS) == RECORDS
    job = build(f"flink-cli-{uuid.uuid4().hex[:6]}", topic, output, max_records=100, bounded=False)
    jid = flink_job_id(job.id)
    flink = Flink(HOME, coordinator.url.removeprefix("http://"))
    savepoints = coordinator.root / "savepoints" / "cli"

    first = start(job, coordinator, spark)
    wait(lambda: job.id in coordinator.service.jobs, 120, "registered")
    wait(lambda: completed(coordinator, jid) >= 1, 120, "a completed checkpoint")
    listed = flink("list")
    assert re.search(rf"{jid} : {re.escape(job.name)} \(RUNNING\)", listed), listed
    assert "No scheduled jobs." in flink("list", "-s")

    savepoint = saved_path(flink("savepoint", jid, str(savepoints)))
    assert (savepoint / "_metadata").is_file() and savepoint.parent == savepoints
    disposed = flink("savepoint", "-d", str(savepoint))
    assert f"Savepoint '{savepoint}' disposed." in disposed and not savepoint.exists()

    stopped = saved_path(flink("stop", "--savepointPath", str(savepoints), jid))
    assert first.ended() is JobStatus.FINISHED and (stopped / "_metadata").is_file()
    wait(lambda: state(coordinator, jid) == "FINISHED", 30, "FINISHED")
    assert re.search(rf"{jid} : .* \(FINISHED\)", flink("list", "-a"))

    second = start(job, coordinator, spark, restore=str(stopped))
    wait(lambda: state(coordinator, jid) == "RUNNING", 120, "RUNNING again")
    assert re.search(rf"{jid} : .* \(RUNNING\)", flink("list", "-r"))
    positions = second.agent.source.positions
    wait(lambda: sum(positions.values()) >= RECORDS, 120, "every record read")
    drained = saved_path(flink("stop", "--drain", "--savepointPath", str(savepoints), jid))
    assert second.ended() is JobStatus.FINISHED and (drained / "_metadata").is_file()
    # stopped, restored, drained: every window fired once, nothing emitted twice
    got = read_output(coordinator.bootstrap, output)
    expected = reference_output(payments(RECORDS), end_of_input=True)
    assert got == expected, difference(got, expected)

    other = build(f"flink-cancel-{uuid.uuid4().hex[:6]}", topic, f"{output}-2", bounded=False)
    other_jid = flink_job_id(other.id)
    third = start(other, coordinator, spark)
    wait(lambda: state(coordinator, other_jid) == "RUNNING", 120, "the other job RUNNING")
    assert f"Cancelled job {other_jid}." in flink("cancel", other_jid)
    assert third.ended() is JobStatus.CANCELED
    wait(lambda: state(coordinator, other_jid) == "CANCELED", 30, "CANCELED")
    listed = flink("list", "-a")
    assert re.search(rf"{other_jid} : .* \(CANCELED\)", listed), listed
    assert re.search(rf"{jid} : .* \(FINISHED\)", listed), listed


def chromium() -> str | None:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium")
    return found if found and (COMPAT / "bin" / "python").is_file() else None


@pytest.mark.skipif(
    chromium() is None,
    reason="needs Debian's chromium (apt-get install chromium) and .venv-compat's Playwright",
)
def test_flinks_dashboard_loads_every_page_with_no_failed_request(
    coordinator: Running, codec: EventCodec, tmp_path: Path
) -> None:
    agent = coordinator.agent(codec)
    jid = flink_job_id(agent.job_id)
    try:
        with coordinator.client() as client:
            for _ in range(2):
                trigger = client.post(f"/jobs/{jid}/checkpoints", json={}).json()["request-id"]
                wait(
                    lambda t=trigger: (
                        client.get(f"/jobs/{jid}/checkpoints/{t}").json()["status"]["id"]
                        == "COMPLETED"
                    ),
                    what="a checkpoint",
                )
        done = subprocess.run(
            [str(COMPAT / "bin" / "python"), str(ROOT / "tests/compat/dashboard_check.py"),
             coordinator.url, jid],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, CHROMIUM=chromium() or "", SCREENSHOTS=str(tmp_path)),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)
        assert report["failed"] == [], report
        assert "GET /flink/jobs/overview" in report["requests"]
        assert f"GET /flink/jobs/{jid}/checkpoints" in report["requests"]
        shown = report["checkpoints"]
        assert re.search(r"Completed:\s*2", shown["overview"]), shown["overview"][:2000]
        assert "COMPLETED" in shown.get("history", "").upper(), shown
    finally:
        agent.stop()


# Flink's CLI over TLS: security.ssl.rest.* in a Flink configuration, against a coordinator with
# mutual TLS (sparkpoint coordinator --rest-tls-cert/--rest-tls-key/--rest-tls-client-ca).

STORE_PASSWORD = "flink-store-password"
FLINK_CIPHER_SUITES = (
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
)  # fmt: skip


def pkcs12_stores(pki: Pki, common_name: str, folder: Path) -> tuple[Path, Path]:
    """Java's keystore (the client certificate ``common_name`` and its key) and truststore (the
    CA), PKCS12, as Flink's ``security.ssl.rest.keystore`` and ``truststore`` take them."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        load_pem_private_key,
        pkcs12,
    )

    cert_file, key_file = pki.client(common_name)
    key = load_pem_private_key(key_file.read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
    encryption = BestAvailableEncryption(STORE_PASSWORD.encode())
    keystore, truststore = folder / f"{common_name}.p12", folder / "truststore.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            common_name.encode(), key, x509.load_pem_x509_certificate(cert_file.read_bytes()),  # type: ignore[arg-type]
            [ca], encryption,
        )
    )  # fmt: skip
    truststore.write_bytes(
        pkcs12.serialize_java_truststore([pkcs12.PKCS12Certificate(ca, b"ca")], encryption)
    )
    return keystore, truststore


def flink_tls_conf(home: Path, keystore: Path, truststore: Path, folder: Path) -> Path:
    """A Flink configuration folder: the package's config.yaml with REST over mutual TLS."""
    folder.mkdir()
    for name in ("log4j-cli.properties", "logback.xml"):
        shutil.copy(home / "conf" / name, folder / name)
    stores = {
        # Flink's default, TLS_RSA_WITH_AES_128_CBC_SHA (no forward secrecy, SHA-1), is one
        # Python's TLS (OpenSSL 3, security level 2) does not offer: name current suites
        "security.ssl.algorithms": ",".join(FLINK_CIPHER_SUITES),
        "security.ssl.rest.enabled": "true",
        "security.ssl.rest.authentication-enabled": "true",
        "security.ssl.rest.keystore": str(keystore),
        "security.ssl.rest.keystore-type": "PKCS12",
        "security.ssl.rest.keystore-password": STORE_PASSWORD,
        "security.ssl.rest.key-password": STORE_PASSWORD,
        "security.ssl.rest.truststore": str(truststore),
        "security.ssl.rest.truststore-type": "PKCS12",
        "security.ssl.rest.truststore-password": STORE_PASSWORD,
    }
    config = (home / "conf" / "config.yaml").read_text()
    config += "\n" + "\n".join(f"{key}: {value}" for key, value in stores.items()) + "\n"
    (folder / "config.yaml").write_text(config)
    return folder


@pytest.fixture(scope="module")
def mutual_tls(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    """A coordinator with mutual TLS: ``oncall`` reads, every other certificate operates; bearer
    tokens too (`tests.rest_tls`)."""
    assert HOME is not None
    root = tmp_path_factory.mktemp("flink-tls")
    pki = Pki(root)
    access = write_access_list(root / "access.json", certificates={"oncall": "read"})
    security = RestSecurity(pki.server_cert, pki.server_key, pki.ca_file, access)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from secured_coordinator(
            kafka, root, pki, security, web_ui=WebUi.load(flink_dist(HOME))
        )


def test_the_flink_cli_drives_a_coordinator_over_mutual_tls_as_its_certificates_principal(
    mutual_tls: Secured, codec: EventCodec, tmp_path: Path
) -> None:
    assert HOME is not None and mutual_tls.pki is not None
    # -m https://...: with a bare host:port Flink's CLI turns security.ssl.rest.enabled off
    pki, address = mutual_tls.pki, mutual_tls.url
    agent = ScriptedAgent(
        mutual_tls.bootstrap, codec, f"job-{uuid.uuid4().hex[:8]}", state_dir=mutual_tls.root
    ).start()
    jid = flink_job_id(agent.job_id)
    wait(lambda: agent.job_id in mutual_tls.service.jobs, what="registered")
    cli = Flink(HOME, address, flink_tls_conf(HOME, *pkcs12_stores(pki, "flink-cli", tmp_path), tmp_path / "cli"))  # fmt: skip
    readonly = Flink(HOME, address, flink_tls_conf(HOME, *pkcs12_stores(pki, "oncall", tmp_path), tmp_path / "oncall"))  # fmt: skip
    try:
        assert re.search(rf"{jid} : .* \(RUNNING\)", cli("list")), "flink list over TLS"
        savepoint = saved_path(cli("savepoint", jid, str(mutual_tls.root / "savepoints" / "tls")))
        assert (savepoint / "_metadata").is_file()

        # a certificate with the read role lists, but may not cancel: Flink's CLI shows our 403
        assert re.search(rf"{jid} : .* \(RUNNING\)", readonly("list"))
        refused = readonly.run("cancel", jid)
        assert refused.returncode != 0 and agent.cancels == []
        assert "oncall has the read role" in refused.stdout + refused.stderr

        # a bearer token in FLINK_REST_CLIENT_HEADERS names the principal over the certificate
        with_token = Flink(readonly.home, address, readonly.conf,
                           {"FLINK_REST_CLIENT_HEADERS": f"Authorization:Bearer {OPERATE_TOKEN}"})  # fmt: skip
        assert f"Cancelled job {jid}." in with_token("cancel", jid)
        agent.wait_for(lambda: len(agent.cancels) == 1, what="the cancellation")
        assert agent.cancels[0].requested_by == "alice"
    finally:
        agent.stop()


def test_flinks_web_ui_is_served_over_mutual_tls(mutual_tls: Secured) -> None:
    with mutual_tls.https("browser-user") as client:
        index = client.get("/flink/")
        overview = client.get("/flink/jobs/overview")
    assert index.status_code == 200 and "<html" in index.text.lower()
    assert overview.status_code == 200 and "jobs" in overview.json()
