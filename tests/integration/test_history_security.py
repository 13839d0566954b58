"""The history service's REST API secured as the coordinator's is, against a real `sparkpoint
history` process serving https on the session's broker: bearer tokens (the read role suffices),
the dashboard's page and the health endpoint open, mutual TLS with the certificate's CN as the
principal, an access list broken and fixed without a restart, a secured coordinator reaching it
with its own certificate, and no token in any answer or in the service's log."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.coordinator.service.earlier import TOKEN_ENV
from tests.conftest import KafkaUnderTest
from tests.integration.test_history_service import PERIODIC, served
from tests.rest_tls import OPERATE_TOKEN, READ_TOKEN, Pki, secured_coordinator, write_access_list
from tests.running_coordinator import coordinator_in_thread, wait
from tests.running_history import SPARKPOINT, HistoryProcess

pytestmark = pytest.mark.integration

TOKENS = (READ_TOKEN, OPERATE_TOKEN)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


class Answers:
    """Every answer a test got, searched for the tokens at its end."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, response: httpx.Response) -> httpx.Response:
        self.seen.append(f"{response.headers}\n{response.text}")
        return response

    def hold_no_token(self, history: HistoryProcess) -> None:
        assert self.seen
        for token in TOKENS:
            assert not any(token in answer for answer in self.seen)
            assert token not in history.log()


@pytest.fixture
def answers() -> Answers:
    return Answers()


def serve_secured(
    history: HistoryProcess, pki: Pki, access: Path | None, mutual: bool = False
) -> HistoryProcess:
    """``history`` started over https with ``access`` (and mutual TLS), ready."""
    flags = ["--rest-tls-cert", str(pki.server_cert), "--rest-tls-key", str(pki.server_key)]
    if access is not None:
        flags += ["--rest-access-file", str(access)]
    if mutual:
        flags += ["--rest-tls-client-ca", str(pki.ca_file)]
    history.flags = tuple(flags)
    history.verify = pki.context("test-harness" if mutual else None)
    history.start().wait_ready()
    return history


def get(
    history: HistoryProcess,
    path: str,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = context if context is not None else history.verify
    return httpx.request(method, f"{history.url}{path}", headers=headers, verify=verify, timeout=10)


def errors(response: httpx.Response) -> list[str]:
    body: dict[str, Any] = response.json()
    assert list(body) == ["errors"], body
    messages: list[str] = body["errors"]
    return messages


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rest-access-file", "{root}/missing.yaml"], "missing.yaml: no such file"),
        (["--rest-access-file", "{root}/broken.json"], "broken.json: tokens must be a list"),
        (["--rest-tls-client-ca", "{root}/ca.pem"], "--rest-tls-client-ca (mutual TLS) needs"),
    ],
)
def test_a_file_that_cannot_be_used_stops_it_before_kafka_is_reached(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    (tmp_path / "broken.json").write_text('{"tokens": {}}')
    command = [SPARKPOINT, "history", "--bootstrap", "127.0.0.1:1"]  # nothing listens there
    command += [flag.format(root=tmp_path) for flag in flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "Kafka" not in done.stderr


def test_every_read_of_its_data_needs_a_token_with_the_read_role(
    history: HistoryProcess, pki: Pki, tmp_path: Path, answers: Answers
) -> None:
    serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
    assert history.url.startswith("https://")
    for path in ("/jobs/overview", "/jobs/some-job/history", "/jobs/some-job/checkpoints"):
        refused = answers(get(history, path))
        assert refused.status_code == 401, (path, refused.text)
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in errors(refused)[0]
    wrong = answers(get(history, "/jobs/overview", "not-a-token-of-the-list"))
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]

    for token in TOKENS:  # read suffices; operate may read too
        overview = answers(get(history, "/jobs/overview", token))
        assert overview.status_code == 200 and overview.json() == {"jobs": []}
    unknown = answers(get(history, "/jobs/some-job/history", READ_TOKEN))
    assert unknown.status_code == 404 and "no history of job" in errors(unknown)[0]
    answers.hold_no_token(history)


def test_the_dashboard_page_and_the_health_endpoint_stay_open(
    history: HistoryProcess, pki: Pki, tmp_path: Path, answers: Answers
) -> None:
    serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
    page = answers(get(history, "/"))
    assert page.status_code == 200 and "sparkpoint history" in page.text
    status = answers(get(history, "/history/status"))
    assert status.status_code == 200 and status.json()["ready"] is True
    # faust's own pages (its table's documents among them) are guarded like the API
    assert answers(get(history, "/table/jobs/")).status_code == 401
    # what the service does not serve: refused without a credential, aiohttp's answer with one
    assert answers(get(history, "/jobs/overview", method="POST")).status_code == 401
    assert answers(get(history, "/", method="POST")).status_code == 401
    posted = answers(get(history, "/jobs/overview", READ_TOKEN, method="POST"))
    assert posted.status_code == 405
    answers.hold_no_token(history)


def test_mutual_tls_admits_a_certificate_by_its_cn_and_refuses_a_handshake_without_one(
    history: HistoryProcess, pki: Pki, tmp_path: Path, answers: Answers
) -> None:
    access = write_access_list(
        tmp_path / "access.json",
        certificates={"oncall": "read", "test-harness": "read"},
        **{"certificate-default-role": "none"},
    )
    serve_secured(history, pki, access, mutual=True)
    oncall = answers(get(history, "/jobs/overview", context=pki.context("oncall")))
    assert oncall.status_code == 200 and oncall.json() == {"jobs": []}
    stranger = answers(get(history, "/jobs/overview", context=pki.context("stranger")))
    assert stranger.status_code == 403 and "'stranger' is not admitted" in errors(stranger)[0]
    # a token names the principal whatever certificate came with it
    vouched = answers(get(history, "/jobs/overview", READ_TOKEN, pki.context("stranger")))
    assert vouched.status_code == 200
    with pytest.raises(httpx.HTTPError):  # the handshake needs a certificate, even for /
        get(history, "/", context=pki.context())
    answers.hold_no_token(history)


def test_a_broken_access_file_refuses_every_read_until_it_is_fixed(
    history: HistoryProcess, pki: Pki, tmp_path: Path, answers: Answers
) -> None:
    access = write_access_list(tmp_path / "access.json")
    serve_secured(history, pki, access)
    assert answers(get(history, "/jobs/overview", READ_TOKEN)).status_code == 200
    good = access.read_text()

    access.write_text(good[: len(good) // 2])  # an edit saved half-way
    broken = answers(get(history, "/jobs/overview", READ_TOKEN))
    assert broken.status_code == 503 and "access list cannot be read" in errors(broken)[0]
    assert answers(get(history, "/history/status")).status_code == 200  # the health: open

    access.write_text(good)
    assert answers(get(history, "/jobs/overview", READ_TOKEN)).status_code == 200
    revoked = json.loads(good)
    revoked["tokens"] = [t for t in revoked["tokens"] if t["principal"] != "grafana"]
    access.write_text(json.dumps(revoked))
    assert answers(get(history, "/jobs/overview", READ_TOKEN)).status_code == 401
    answers.hold_no_token(history)


@pytest.mark.parametrize("credential", ["certificate", "token"])
def test_a_secured_coordinator_reaches_it_with_its_certificate_or_its_token(
    kafka: KafkaUnderTest,
    history: HistoryProcess,
    pki: Pki,
    tmp_path: Path,
    codec: EventCodec,
    monkeypatch: pytest.MonkeyPatch,
    credential: str,
) -> None:
    """The failover of test_history_service, the second owner reaching a secured history
    service: under mutual TLS with its own certificate, which the history service admits by its
    name (trustme's certificate has no CN: its DNS name, localhost) and no other; or, with
    tokens and no client certificates, with the read token of --history-token-file (here its
    variable) and the history's CA trusted through SSL_CERT_FILE."""
    if credential == "certificate":
        access = write_access_list(
            tmp_path / "access.json",
            certificates={"localhost": "read", "test-harness": "read"},
            **{"certificate-default-role": "none"},
        )
        serve_secured(history, pki, access, mutual=True)
        security = RestSecurity(pki.server_cert, pki.server_key, pki.ca_file)
    else:
        history.token = READ_TOKEN
        serve_secured(history, pki, write_access_list(tmp_path / "access.json"))
        monkeypatch.setenv(TOKEN_ENV, READ_TOKEN)
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))
        security = RestSecurity(pki.server_cert, pki.server_key)
    with contextlib.contextmanager(coordinator_in_thread)(kafka, tmp_path) as first:
        agent = first.agent(codec, configuration=PERIODIC)
        agent.wait_for(lambda: len(agent.completed) >= 3, what="checkpoints under the first owner")
        before = first.service.job(agent.job_id).core.stats.completed
    second_owner = contextlib.contextmanager(secured_coordinator)
    try:
        with second_owner(kafka, tmp_path, pki, security, history_url=history.url) as second:
            wait(lambda: agent.job_id in second.service.jobs, what="the job taken over")
            wait(
                lambda: (
                    (served(history, agent.job_id) or {}).get("counts", {}).get("completed", 0)
                    >= before
                ),
                what="the history service caught up",
            )
            done = len(agent.completed)
            agent.wait_for(lambda: len(agent.completed) >= done + 2, what="checkpoints after it")
            own = second.service.job(agent.job_id).core.stats.to_json()
            with second.https("oncall" if credential == "certificate" else None) as client:
                merged = client.get(f"/jobs/{agent.job_id}/checkpoints").json()
    finally:
        agent.stop()
    # what only the history service knows was added: it admitted the coordinator
    assert before > 0 and merged["counts"]["completed"] >= own["counts"]["completed"] + before
    ids = [entry["id"] for entry in merged["history"]]
    assert any(i < min(entry["id"] for entry in own["history"]) for i in ids), "the first owner's"
