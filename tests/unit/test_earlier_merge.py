"""A coordinator's checkpoint statistics plus the history service's for earlier ownership
epochs (sparkpoint.coordinator.service.earlier.merge), and a history service that refuses the
coordinator (an answer in memory, httpx's MockTransport), and the history token: a secret, said
once when it goes over plain http."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest

from sparkpoint.common.redaction import REDACTED, redact_text
from sparkpoint.coordinator.service.earlier import TOKEN_ENV, earlier_statistics, merge

pytestmark = pytest.mark.unit


def summary(low: int, high: int, avg: int) -> dict[str, Any]:
    return {"min": low, "max": high, "avg": avg, "p50": float(avg), "p99": float(high)}


def statistics(
    completed: int, failed: int, in_progress: int, ids: list[int], durations: tuple[int, int, int]
) -> dict[str, Any]:
    return {
        "counts": {
            "restored": 0, "total": completed + failed + in_progress, "in_progress": in_progress,
            "completed": completed, "failed": failed,
        },
        "summary": {
            "end_to_end_duration": summary(*durations),
            "state_size": summary(100, 100, 100),
            "processed_data": summary(7, 7, 7),
        },
        "latest": {"completed": {"id": ids[0]} if ids else None, "savepoint": None,
                   "failed": None, "restored": None},
        "history": [{"id": i} for i in ids],
    }  # fmt: skip


def test_counts_add_up_and_the_earlier_fill_the_history_behind_the_owners_own() -> None:
    own = statistics(3, 0, 1, [12, 11, 10, 9], (10, 30, 20))
    earlier = {**statistics(6, 2, 0, [8, 7, 6, 5, 4], (40, 100, 60))}
    earlier["latest"] = {"completed": {"id": 8}, "savepoint": {"id": 6}, "failed": {"id": 7},
                         "restored": None}  # fmt: skip
    merged = merge(own, earlier, history_size=6)
    assert merged["counts"] == {
        "restored": 0, "total": 12, "in_progress": 1, "completed": 9, "failed": 2,
    }  # fmt: skip
    assert [e["id"] for e in merged["history"]] == [12, 11, 10, 9, 8, 7]
    assert merged["latest"]["completed"] == {"id": 12}, "the owner's own where it has one"
    assert merged["latest"]["savepoint"] == {"id": 6}, "else the earlier"
    duration = merged["summary"]["end_to_end_duration"]
    assert (duration["min"], duration["max"], duration["avg"]) == (10, 100, (20 * 3 + 60 * 6) // 9)
    assert merged["summary"]["processed_data"] == own["summary"]["processed_data"]


def test_an_owner_that_completed_nothing_yet_answers_the_earlier_summary() -> None:
    own = statistics(0, 0, 1, [5], (0, 0, 0))
    merged = merge(own, statistics(4, 0, 0, [4, 3, 2, 1], (40, 90, 60)), history_size=10)
    assert merged["summary"]["end_to_end_duration"]["max"] == 90
    assert [e["id"] for e in merged["history"]] == [5, 4, 3, 2, 1]


def test_an_entry_both_know_is_listed_once() -> None:
    own = statistics(1, 0, 0, [5, 4], (10, 10, 10))
    merged = merge(own, statistics(2, 0, 0, [4, 3], (10, 10, 10)), history_size=10)
    assert [e["id"] for e in merged["history"]] == [5, 4, 3]


def test_a_history_service_that_refuses_the_coordinator_is_said_once_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusal = {"errors": ["authentication required: send Authorization: Bearer <token>"]}

    def history(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json=refusal)

    async def ask_twice() -> list[dict[str, Any] | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(history)) as client:
            url = "https://history.example:8082"
            return [await earlier_statistics(client, url, "job-1", 2) for _ in range(2)]

    with caplog.at_level(logging.WARNING, logger="sparkpoint.coordinator.service.earlier"):
        assert asyncio.run(ask_twice()) == [None, None]
    (said,) = caplog.records
    assert "history.example:8082 refused this coordinator (401: authentication required" in (
        said.getMessage()
    )
    assert "mutual TLS" in said.getMessage()


def ask(history_url: str, times: int = 1) -> list[str | None]:
    """The Authorization header of each of ``times`` requests to a history service answering
    404."""
    sent: list[str | None] = []

    def history(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("Authorization"))
        return httpx.Response(404, json={"errors": ["no history of job 'job-1'"]})

    async def asked() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(history)) as client:
            for _ in range(times):
                await earlier_statistics(client, history_url, "job-1", 2)

    asyncio.run(asked())
    return sent


def test_the_history_token_from_the_environment_is_a_secret_kept_out_of_logs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = "history-token-from-the-environment-7c1e"
    monkeypatch.setenv(TOKEN_ENV, token)
    assert ask("https://history.example:8082") == [f"Bearer {token}"]
    assert redact_text(f"GET failed with {token}") == f"GET failed with {REDACTED}"


def test_a_history_token_sent_over_plain_http_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "history-token-in-clear-3b9d")
    with caplog.at_level(logging.WARNING, logger="sparkpoint.coordinator.service.earlier"):
        assert (
            ask("http://history.example:8082", times=2)
            == ["Bearer history-token-in-clear-3b9d"] * 2
        )
        ask("https://history.example:8443")
    (said,) = caplog.records
    assert said.getMessage().startswith(
        "the history token is sent to http://history.example:8082 over plain http"
    )
    assert "history-token-in-clear-3b9d" not in said.getMessage()


def test_without_a_token_plain_http_is_not_worth_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="sparkpoint.coordinator.service.earlier"):
        assert ask("http://history.example:8084") == [None]
    assert caplog.records == []
