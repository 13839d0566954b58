"""Bytes that cross the driver on the data path, counted: what the driver ships to Spark tasks
(the pickled task objects ``parallelize`` carries) and what the tasks send back (Spark's own
``resultSize`` task metric, summed per stage from the application status store). Only metadata
should cross: segment paths, row counts, offsets, state versions; records stay on the executors
and in segment files."""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from typing import Any

SETTLE_EVERY = 32
"""Spark jobs in a row after which their stages are looked up (the lookups are cheap, but the
status store only keeps the latest 1000 stages)."""

DONE = {"COMPLETE", "FAILED", "SKIPPED"}


class DriverTraffic:
    def __init__(self) -> None:
        self.to_tasks = 0
        self.from_tasks = 0
        """Spark's ``resultSize`` of every settled stage."""
        self.stages = 0
        self._prefix = uuid.uuid4().hex[:12]
        self._jobs = 0
        self._pending: list[str] = []
        self._lock = threading.Lock()

    def start_job(self, sc: Any, description: str, tasks: object) -> str:
        """Tags the Spark job the calling thread runs next (a job group of its own, returned) and
        counts the tasks it ships."""
        size = len(pickle.dumps(tasks, protocol=pickle.HIGHEST_PROTOCOL))
        with self._lock:
            self._jobs += 1
            group = f"sparkpoint-{self._prefix}-{self._jobs}"
            self._pending.append(group)
            self.to_tasks += size
            due = len(self._pending) >= SETTLE_EVERY
        sc.setJobGroup(group, description)
        if due:
            self.settle(sc)
        return group

    def add_call(self, to_tasks: int, from_tasks: int) -> None:
        """Counts a call of the resident workers (`resident`): its bytes each way, as one stage."""
        with self._lock:
            self.to_tasks += to_tasks
            self.from_tasks += from_tasks
            self.stages += 1

    def cancel_open(self, sc: Any) -> None:
        """Cancels the Spark jobs of every group not yet settled (finished ones ignore it): a
        failed attempt's rounds in flight, whose records are read again after the restore."""
        with self._lock:
            pending = list(self._pending)
        for group in pending:
            sc.cancelJobGroup(group)

    def settle(self, sc: Any, wait_s: float = 0.0) -> int:
        """Adds the result sizes of finished jobs' stages; returns how many jobs are still open
        (the status store learns of a finished job a moment after it returns). Waits up to
        ``wait_s`` for them."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                pending = list(self._pending)
            done = [group for group in pending if self._add_stages(sc, group)]
            with self._lock:
                self._pending = [g for g in self._pending if g not in done]
                left = len(self._pending)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def _add_stages(self, sc: Any, group: str) -> bool:
        tracker = sc.statusTracker()
        job_ids = tracker.getJobIdsForGroup(group)
        if not job_ids:
            return False
        store = sc._jsc.sc().statusStore()
        sizes = 0
        stages = 0
        for job_id in job_ids:
            info = tracker.getJobInfo(job_id)
            if info is None or info.status not in ("SUCCEEDED", "FAILED"):
                return False
            for stage_id in info.stageIds:
                try:
                    stage = store.lastStageAttempt(stage_id)
                except Exception:  # not in the store (yet, or evicted)
                    return False
                if stage.status().toString() not in DONE:
                    return False
                sizes += int(stage.resultSize())
                stages += 1
        with self._lock:
            self.from_tasks += sizes
            self.stages += stages
        return True

    @property
    def total(self) -> int:
        return self.to_tasks + self.from_tasks
