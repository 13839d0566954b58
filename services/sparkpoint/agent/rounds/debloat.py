"""Buffer debloating for rounds (Flink's FLIP-183, ``taskmanager.network.memory.buffer-debloat.*``).

Flink sizes the buffers between tasks so that the data in flight is consumed within a target
time (1 s by default): under backpressure, an aligned checkpoint's barrier then waits behind
about that much data, not behind full buffers. Here the data in flight is what a round reads:
stage 2 of the next round processes it, and an aligned checkpoint waits for the round in flight
(its barrier goes right after what that round took: `barriers.place_barriers`). So a round reads
at most the source records rounds process in the target time: records per second of a round's
time (submission to collection: what an aligned checkpoint waits for), over the rounds that
took a backlog (one that waited for input is not slow: Flink leaves idle time out of its
throughput the same way), averaged over ``samples`` rounds. Rows are counted as the source's
records: a job's map may keep fewer rows, or make more, than it reads.

A round also has a fixed cost (scheduling, state folds). Shrinking reads makes rounds shorter
only down to it, and each shrink lowers the measured rate again: with a target near the fixed
cost, the bound would fall until the job crawled. So it never falls below a quarter of the
largest round measured: rounds stay within a few times their fixed cost, and throughput within
a few times of what it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.agent.sources import Partition, share_by_backlog

MIN_RECORDS_PER_PARTITION = 100
"""A partition's share is never below this."""


@dataclass
class Debloater:
    target_ms: int
    samples: int = 20
    """Rounds the rate is averaged over (Flink's ``buffer-debloat.samples``)."""
    rate: float | None = None
    """Source records per second of a busy round (None: none measured yet)."""
    largest: float = 0.0
    """The most source records a busy round processed."""
    rows_per_record: float = 1.0
    """Rows the job's map makes of a source record, over recent reads."""

    @property
    def weight(self) -> float:
        """An exponential moving average's weight for ``samples`` samples."""
        return 2 / (self.samples + 1)

    def read(self, records: int, rows: int) -> None:
        """A read took ``records`` from the source and queued ``rows`` for stage 2."""
        if records > 0:
            self.rows_per_record += self.weight * (rows / records - self.rows_per_record)

    def observe(self, rows: int, seconds: float, busy: bool) -> None:
        """A round's stage 2 processed ``rows`` in ``seconds``; ``busy``: it took them from a
        backlog (only such a round tells how fast rounds go)."""
        if not busy or rows <= 0 or seconds <= 0 or self.rows_per_record <= 0:
            return
        records = rows / self.rows_per_record
        self.largest = max(self.largest, records)
        sample = records / seconds
        self.rate = sample if self.rate is None else self.rate + self.weight * (sample - self.rate)

    @property
    def budget(self) -> int | None:
        """The source records a round may read (None: no bound yet)."""
        if self.rate is None:
            return None
        return max(1, int(max(self.rate * self.target_ms / 1000, self.largest / 4)))

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
