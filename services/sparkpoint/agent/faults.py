"""Scripted failure injection for the agent (tests only): ``SPARKPOINT_CRASH_AT=point[:n]`` kills
the agent process with SIGKILL the n-th time (default: first) it passes the named point. Points:

- ``mid-batch``: stage 1 of a round fetched records, before stage 2 processed them;
- ``mid-batch-after-complete``: the same, counting only rounds once the latest completed
  checkpoint holds keyed state (incremental checkpoints, the agent's default: so a restore finds
  state to restore and the killed run left working state behind, however slow the storage and
  whatever the rounds' pace);
- ``after-ack``: a checkpoint was acknowledged, before its completion was processed;
- ``after-complete``: a checkpoint's completion arrived, before the sinks committed its epoch;
- ``after-complete-in-flight``: the same, counting only checkpoints that persisted in-flight
  records as channel state (so a restore from it has channel state to process);
- ``mid-publish``: the Kafka sink's transaction holds an epoch's records (half of them when
  they were not written ahead), delivered and not committed;
- ``declined-in-recovery``: a trigger was declined TASK_NOT_READY while restored channel state
  was still being split or processed (inside recovery);
- ``during-recovery``: a job splitting restored channel state by owner finished, some of the
  split segments maybe not yet in their channels.

Nothing happens when the variable is unset.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = (
    "mid-batch", "mid-batch-after-complete", "after-ack", "after-complete", "after-complete-in-flight", "mid-publish",
    "declined-in-recovery", "during-recovery",
)  # fmt: skip

_passes: dict[str, int] = {}


def armed(point: str) -> bool:
    """A crash at ``point`` is scripted (for work that only the crash needs, such as a flush)."""
    return os.environ.get("SPARKPOINT_CRASH_AT", "").partition(":")[0] == point


def crash_point(point: str) -> None:
    if passes(point):
        kill(point)


def passes(point: str) -> bool:
    """Counts a pass of ``point`` in this process; true when this pass is the scripted crash
    (for a crash prepared elsewhere, such as a Spark task leaving a transaction open, then
    carried out here by `kill`)."""
    if not armed(point):
        return False
    count = os.environ["SPARKPOINT_CRASH_AT"].partition(":")[2]
    _passes[point] = _passes.get(point, 0) + 1
    return _passes[point] >= int(count or 1)


def kill(point: str) -> None:
    sys.stderr.write(f"sparkpoint agent: crash point {point} reached, SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
