"""Bounds on values that travel in events and requests: what a job id may look like, how large
an id, a size or a piece of text may be. Services check what they read against these before it
can reach a running job."""

from __future__ import annotations

import re

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Letters, digits, '.', '_' and '-', at most 128: a job id names directories and topic keys."""

MAX_ID = 2**53 - 1
"""Checkpoint ids, sizes and durations stay below 2^53: exact in JSON numbers and far from
Avro's long overflow however far a counter advances."""

HEARTBEAT_INTERVAL_MS = 1_000
"""How often an agent tells the coordinator it is alive and drives its job."""

LEASE_TIMEOUT_MS = 10_000
"""How long after its last heartbeat an agent still holds its job: ten missed heartbeats. Long
enough that a busy driver or a slow broker does not lose its job; short next to the 15 s a new
agent process takes to start Spark, so a restart after a crash is never kept waiting."""

MAX_TEXT = 4096
"""Free text in events (names, messages, paths, option values)."""


def job_id_problem(job_id: str) -> str | None:
    """Why ``job_id`` is not a valid job id, or None."""
    if not JOB_ID_PATTERN.match(job_id):
        shown = job_id if len(job_id) <= 80 else job_id[:80] + "..."
        return f"job id {shown!r} must be letters, digits, '.', '_' or '-' (at most 128, starting with a letter or digit)"
    return None
