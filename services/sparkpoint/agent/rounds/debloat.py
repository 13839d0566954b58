"""Buffer debloating for rounds (Flink's FLIP-183, ``taskmanager.network.memory.buffer-debloat.*``).

Flink sizes the buffers between tasks so that the data in flight is consumed within a target
time (1 s by default): under backpressure, an aligned checkpoint's barrier then waits behind
about that much data, not behind full buffers. Here the data in flight is what a round reads:
stage 2 of the next round processes it, and an aligned checkpoint waits for the round in flight
(its barrier goes right after what that round took: `barriers.place_barriers`). So a round reads
at most the source records a round processes in the target time.

A round's time (submission to collection: what an aligned checkpoint waits for) is a fixed cost
(scheduling, state folds) plus a cost per record; both are fitted to recent rounds that had a
backlog (a round that waited for input is not slow: Flink leaves idle time out of its
throughput the same way). The bound is the records that fit in the target after the fixed
cost. A target at or below the fixed cost cannot be met by reading less, so reads are then not
bounded (and the agent says so once) instead of shrinking to nothing. Rows are counted as the
source's records: a job's map may keep fewer rows, or make more, than it reads.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sparkpoint.agent.sources import Partition, share_by_backlog

log = logging.getLogger(__name__)

MIN_RECORDS_PER_PARTITION = 100
"""A read never bounded below this, whatever the fit (a round has a fixed cost)."""


@dataclass
class Debloater:
    target_ms: int
    samples: int = 20
    """Rounds the fit is made over (Flink's ``buffer-debloat.samples``)."""
    rounds: deque[tuple[float, float]] = field(default_factory=deque)
    """(source records, seconds) of recent busy rounds."""
    rows_per_record: float = 1.0
    """Rows the job's map makes of a source record, over recent reads."""
    unreachable: bool = False
    """The target lies at or below a round's fixed cost: reads are not bounded."""

    def read(self, records: int, rows: int) -> None:
        """A read took ``records`` from the source and queued ``rows`` for stage 2."""
        if records > 0:
            weight = 2 / (self.samples + 1)
            self.rows_per_record += weight * (rows / records - self.rows_per_record)

    def observe(self, rows: int, seconds: float, busy: bool) -> None:
        """A round's stage 2 processed ``rows`` in ``seconds``; ``busy``: it took them from a
        backlog (only such a round tells how long rows take)."""
        if not busy or rows <= 0 or seconds <= 0 or self.rows_per_record <= 0:
            return
        self.rounds.append((rows / self.rows_per_record, seconds))
        while len(self.rounds) > max(self.samples, 2):
            self.rounds.popleft()

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per record) of a round, by least squares over the recent
        busy rounds; None while they do not tell the two apart (fewer than two, or all of one
        size)."""
        if len(self.rounds) < 2:
            return None
        records = np.array([r for r, _ in self.rounds])
        seconds = np.array([s for _, s in self.rounds])
        spread = float(records.var())
        if spread <= (0.05 * float(records.mean())) ** 2:
            return None
        per_record = (
            float(((records - records.mean()) * (seconds - seconds.mean())).mean()) / spread
        )
        fixed = float(seconds.mean()) - per_record * float(records.mean())
        return max(0.0, fixed), per_record

    @property
    def budget(self) -> int | None:
        """The source records a round may read (None: no bound)."""
        if not self.rounds:
            return None
        target = self.target_ms / 1000
        fitted = self.fit()
        if fitted is None:  # one size of round so far: scale it to the target
            records, seconds = self.rounds[-1]
            return max(1, int(records * target / seconds))
        fixed, per_record = fitted
        if per_record <= 0 or fixed >= target:
            if not self.unreachable:
                log.warning(
                    "buffer debloating: a round's fixed cost (%.0f ms) is at or above the "
                    "target (%d ms); reads are not bounded", fixed * 1000, self.target_ms,
                )  # fmt: skip
            self.unreachable = True
            return None
        self.unreachable = False
        return max(1, int((target - fixed) / per_record))

    def bounds(self, backlog: dict[Partition, int | None]) -> dict[Partition, int]:
        """Per partition to read, its share of the budget by backlog (a partition whose backlog
        is unknown counts as the largest known one); empty: no bound."""
        budget = self.budget
        if budget is None or not backlog:
            return {}
        known = [lag for lag in backlog.values() if lag]
        guess = max(known) if known else budget
        sizes: dict[Partition, int | None] = {p: lag or guess for p, lag in backlog.items()}
        return {
            p: max(MIN_RECORDS_PER_PARTITION, share)
            for p, share in share_by_backlog(sizes, budget).items()
        }
