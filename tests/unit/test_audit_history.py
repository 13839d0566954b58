"""`sparkpoint audit` reading the history service (sparkpoint.audit), against an
`httpx.MockTransport` answering as the secured service does: its status open to all, every read
of job data refused without the read token (the guard's 401 body). A refusal is one line naming
the flag that helps, never the token."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sparkpoint import audit
from sparkpoint.client import Credentials

pytestmark = pytest.mark.unit

URL = "http://history:8082"
TOKEN = "read-token-for-the-history-0123"
JOB = "job-1"


def history_doc() -> dict[str, object]:
    """One job's document with one completed checkpoint, as the history service serves it."""
    return {
        "job_id": JOB,
        "config_changes": [],
        "history": [
            {
                "id": 1, "is_savepoint": False, "status": "COMPLETED", "trigger_timestamp": 1_000,
                "latest_ack_timestamp": 1_050, "end_to_end_duration": 50,
                "external_path": "file:///cp/chk-1",
            }
        ],
    }  # fmt: skip


def secured_history(token: str = TOKEN, status: int = 401) -> httpx.MockTransport:
    """The history service's answers: ``/history/status`` open, the rest only with ``token``,
    else ``status`` with the guard's body."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/history/status":
            return httpx.Response(200, json={"ready": True, "jobs": 1})
        if request.headers.get("Authorization") != f"Bearer {token}":
            body = {"errors": ["authentication required: send Authorization: Bearer <token>"]}
            return httpx.Response(status, json=body)
        if request.url.path == "/jobs/overview":
            return httpx.Response(200, json={"jobs": [{"sparkpoint.job_id": JOB}]})
        if request.url.path == f"/jobs/{JOB}/history":
            return httpx.Response(200, json=history_doc())
        return httpx.Response(404, json={"errors": ["no history of job"]})

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("job_id", [JOB, None], ids=["one job", "every job"])
def test_without_a_token_a_secured_history_is_one_line_naming_the_token_flag(
    job_id: str | None,
) -> None:
    transport = secured_history()
    assert audit.history_answers(URL, transport=transport), "its status is open to all"
    with pytest.raises(audit.HistoryUnreadable) as raised:
        audit.from_history(URL, job_id, None, transport=transport)
    message = str(raised.value)
    assert "\n" not in message and "HTTP 401" in message
    assert "--history-token-file" in message and "$SPARKPOINT_HISTORY_TOKEN" in message


def test_a_wrong_token_is_refused_without_being_shown() -> None:
    with pytest.raises(audit.HistoryUnreadable) as raised:
        audit.from_history(URL, JOB, None, Credentials(token="wrong-" + TOKEN), secured_history())
    assert "HTTP 401" in str(raised.value) and TOKEN not in str(raised.value)


def test_a_403_names_the_token_and_the_client_certificate() -> None:
    with pytest.raises(audit.HistoryUnreadable) as raised:
        audit.from_history(URL, JOB, None, transport=secured_history(status=403))
    assert "HTTP 403" in str(raised.value)
    assert "--history-token-file" in str(raised.value) and "--history-cert" in str(raised.value)


def test_the_read_token_reads_every_job() -> None:
    read = audit.from_history(URL, None, None, Credentials(token=TOKEN), secured_history())
    assert [entry.text for entry in read] == [
        "checkpoint 1 COMPLETED after 50 ms at file:///cp/chk-1"
    ]


def test_another_http_error_is_one_line_too() -> None:
    broken = httpx.MockTransport(lambda request: httpx.Response(500, text="oops"))
    with pytest.raises(audit.HistoryUnreadable) as raised:
        audit.from_history(URL, JOB, None, transport=broken)
    assert str(raised.value) == (
        f"the history service at {URL} answered GET /jobs/{JOB}/history with HTTP 500: "
        "Internal Server Error"
    )


def test_a_service_that_does_not_answer_is_not_there() -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert not audit.history_answers(URL, transport=httpx.MockTransport(unreachable))


def test_a_credential_file_that_cannot_be_used_names_the_history_flag(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(ValueError, match=f"^--history-ca {missing}: no such file$"):
        audit.history_client("https://history:8082", Credentials(ca=missing))
