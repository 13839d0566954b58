"""Where a checkpoint's milliseconds go inside the coordinator service: the wall-clock moment of
each step of each checkpoint, for `bench/coordinator_latency.py`. Off unless a caller installs
one (``CoordinatorService.trace``); with none installed the service pays one ``is None`` test per
step.

Steps, in the order a checkpoint passes them (names are the keys of `CheckpointTrace.at`):

1. ``triggered``: the job's coordinator decided to trigger (``CommandExecutor.execute``);
2. ``trigger_committed``: the transaction with the id counter and the trigger committed;
3. ``last_ack_received``: the acknowledgement reader took the last subtask's answer off the
   broker (its thread);
4. ``last_ack_handled``: the event loop handled the last answer (the checkpoint is acknowledged);
5. ``metadata_written``: the ``_metadata`` file is written and renamed (by a file thread);
6. ``completed``: the job's coordinator completed the checkpoint;
7. ``completion_committed``: the transaction with the completion notification committed.

What happens at the agent (the trigger seen, the answer produced, the notification seen) is the
benchmark's to record, on the same clock (one machine, ``time.time``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def wall_ms() -> float:
    """Milliseconds since the epoch, with a fraction: the clock every step is read from."""
    return time.time() * 1000


@dataclass
class CheckpointTrace:
    job_id: str
    checkpoint_id: int
    at: dict[str, float] = field(default_factory=dict)


class StepTrace:
    """Step times per (job, checkpoint), the latest time of each step. Written from the loop,
    the acknowledgement reader and the writers' threads without a lock (each write is one
    dictionary operation)."""

    def __init__(self) -> None:
        self._at: dict[tuple[str, int], dict[str, float]] = {}

    def mark(self, job_id: str, checkpoint_id: int, step: str, at_ms: float | None = None) -> None:
        at = wall_ms() if at_ms is None else at_ms
        self._at.setdefault((job_id, checkpoint_id), {})[step] = at

    def traces(self) -> list[CheckpointTrace]:
        return [
            CheckpointTrace(job, checkpoint, dict(at))
            for (job, checkpoint), at in list(self._at.items())
        ]
