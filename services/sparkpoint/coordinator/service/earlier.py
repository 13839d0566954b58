"""Checkpoint statistics from before this coordinator owned a job, asked of the history service.

A coordinator counts what it saw itself: after a failover the new owner would start again from
one. With ``--history-url`` it asks the history service (``sparkpoint history``) for what
happened under earlier ownership epochs and adds it, so ``GET /jobs/:id/checkpoints`` (and Flink's
dashboard and CLI reading it) keeps the whole history. The history service is asked for earlier
epochs only: what this owner saw is counted once, from its own exact statistics.

If the history service does not answer within ``TIMEOUT_S``, the coordinator answers with its
own statistics alone, as without the option.

A secured history service (`sparkpoint.history.security`) is called as the coordinator calls
another instance, with the coordinator's own REST TLS files (``--rest-tls-*``, Flink's
``security.ssl.rest.*`` being the client's files too): the system's CAs and, under mutual TLS,
the client CA verify the history service's certificate, and under mutual TLS the coordinator
presents its own certificate, whose name (subject CN, else its first DNS name) the history
service's access list admits (by name with the read role, or by its default certificate role).
A history service that takes bearer tokens is given one: ``--history-token-file FILE`` (or
``$SPARKPOINT_HISTORY_TOKEN``), a token its access list admits with the read role. A history
service that refuses the coordinator gets no second try per request: the coordinator answers
with its own statistics, and says why once (`REFUSED`). The token is registered as a secret
(scrubbed from every log record); sent to a plain ``http://`` history service it travels in
clear, which is said once per URL.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import quote

import httpx

from sparkpoint.common.redaction import register_secrets

log = logging.getLogger(__name__)

TIMEOUT_S = 1.0
COUNTED = ("completed", "failed")
MERGED_METRICS = ("end_to_end_duration", "state_size", "checkpointed_size")
"""What the history service knows of every checkpoint; per-subtask figures (processed and
persisted data) are the owner's alone."""
REFUSED = (401, 403)
"""The history service's answers to a coordinator it does not admit: said once per URL and
status (`_said`), not on every request."""
_said: set[tuple[str, int]] = set()

TOKEN_ENV = "SPARKPOINT_HISTORY_TOKEN"
"""The bearer token the coordinator shows the history service (``--history-token-file`` sets
it from a file)."""
_in_clear: set[str] = set()
"""The plain-http history URLs the token was sent to, said once each."""


def history_headers(history_url: str) -> dict[str, str]:
    """The ``Authorization`` header with ``$SPARKPOINT_HISTORY_TOKEN``, registered as a secret
    when read; none without a token."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        return {}
    register_secrets([token])
    if not history_url.lower().startswith("https://") and history_url not in _in_clear:
        _in_clear.add(history_url)
        log.warning(
            "the history token is sent to %s over plain http: anyone on the way can read and "
            "use it; serve the history service over https (--rest-tls-cert, --rest-tls-key)",
            history_url,
        )
    return {"Authorization": f"Bearer {token}"}


async def earlier_statistics(
    client: httpx.AsyncClient, history_url: str, job_id: str, owner_epoch: int
) -> dict[str, Any] | None:
    url = f"{history_url.rstrip('/')}/jobs/{quote(job_id, safe='')}/checkpoints"
    try:
        response = await client.get(
            url,
            params={"before_epoch": owner_epoch},
            headers=history_headers(history_url),
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        log.info("history service at %s did not answer: %s", history_url, exc)
        return None
    if response.status_code in REFUSED:
        _say_refused(history_url, response)
    if response.status_code != 200:
        return None  # 404: the history service has not seen the job (yet)
    answer: dict[str, Any] = response.json()
    return answer


def _say_refused(history_url: str, response: httpx.Response) -> None:
    if (history_url, response.status_code) in _said:
        return
    _said.add((history_url, response.status_code))
    try:
        why = "; ".join(response.json()["errors"])
    except (ValueError, KeyError, TypeError):
        why = response.reason_phrase
    log.warning(
        "the history service at %s refused this coordinator (%d: %s): its statistics from "
        "before this instance owned a job are left out. Give the coordinator a token the "
        "history service admits with the read role (--history-token-file), or run both under "
        "mutual TLS with certificates from the same CA and admit this coordinator's certificate",
        history_url, response.status_code, why,
    )  # fmt: skip


def merge(own: dict[str, Any], earlier: dict[str, Any], history_size: int) -> dict[str, Any]:
    """``own`` (this coordinator's statistics) plus ``earlier`` (the history service's, for
    epochs before this owner's): counts add up, min/max/avg cover both, the latest entries and
    percentiles are this owner's where it has them, and the history list is filled up with
    earlier entries to ``history_size``."""
    merged = dict(own)
    counts = dict(own["counts"])
    for name in COUNTED:
        counts[name] += earlier["counts"][name]
    counts["total"] = counts["completed"] + counts["failed"] + counts["in_progress"]
    merged["counts"] = counts
    own_completed = own["counts"]["completed"]
    earlier_completed = earlier["counts"]["completed"]
    summary = {}
    for name, mine in own["summary"].items():
        theirs = earlier["summary"].get(name) if name in MERGED_METRICS else None
        summary[name] = _summary(mine, theirs, own_completed, earlier_completed)
    merged["summary"] = summary
    merged["latest"] = {
        kind: own["latest"].get(kind) or earlier["latest"].get(kind) for kind in own["latest"]
    }
    seen = {entry["id"] for entry in own["history"]}
    older = [entry for entry in earlier["history"] if entry["id"] not in seen]
    room = max(0, history_size - len(own["history"]))
    merged["history"] = [*own["history"], *older[:room]]
    return merged


def _summary(
    mine: dict[str, Any], theirs: dict[str, Any] | None, mine_n: int, theirs_n: int
) -> dict[str, Any]:
    if theirs is None or theirs_n == 0:
        return mine
    if mine_n == 0:
        return theirs
    combined = dict(mine)
    combined["min"] = min(mine["min"], theirs["min"])
    combined["max"] = max(mine["max"], theirs["max"])
    combined["avg"] = (mine["avg"] * mine_n + theirs["avg"] * theirs_n) // (mine_n + theirs_n)
    return combined
