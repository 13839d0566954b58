"""Checkpoint statistics from before this coordinator owned a job, asked of the history service.

A coordinator counts what it saw itself: after a failover the new owner would start again from
one. With ``--history-url`` it asks the history service (``sparkpoint history``) for what
happened under earlier ownership epochs and adds it, so ``GET /jobs/:id/checkpoints`` (and Flink's
dashboard and CLI reading it) keeps the whole history. The history service is asked for earlier
epochs only: what this owner saw is counted once, from its own exact statistics.

If the history service does not answer within ``TIMEOUT_S``, the coordinator answers with its
own statistics alone, as without the option.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx

log = logging.getLogger(__name__)

TIMEOUT_S = 1.0
COUNTED = ("completed", "failed")
MERGED_METRICS = ("end_to_end_duration", "state_size", "checkpointed_size")
"""What the history service knows of every checkpoint; per-subtask figures (processed and
persisted data) are the owner's alone."""


async def earlier_statistics(
    client: httpx.AsyncClient, history_url: str, job_id: str, owner_epoch: int
) -> dict[str, Any] | None:
    url = f"{history_url.rstrip('/')}/jobs/{quote(job_id, safe='')}/checkpoints"
    try:
        response = await client.get(url, params={"before_epoch": owner_epoch}, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.info("history service at %s did not answer: %s", history_url, exc)
        return None
    if response.status_code != 200:
        return None  # 404: the history service has not seen the job (yet)
    answer: dict[str, Any] = response.json()
    return answer


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
