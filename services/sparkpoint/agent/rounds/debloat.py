"""Buffer debloating for rounds (Flink's FLIP-183, ``taskmanager.network.memory.buffer-debloat.*``).

Flink sizes the buffers between tasks so that the data in flight is consumed within a target
time (1 s by default): under backpressure, an aligned checkpoint's barrier then waits behind
about that much data, not behind full buffers. Here the data in flight is what a round reads:
stage 2 of the next round processes it, and an aligned checkpoint waits for the round in flight
(its barrier goes right after what that round took: `barriers.place_barriers`). So a round reads
at most what rounds process in the target time: records per second of a round's time
(submission to collection: what an aligned checkpoint waits for), over rounds that had work
(one that waited for input is not slow), averaged over recent rounds as Flink averages its
throughput samples. A round's fixed cost (scheduling, about 0.2 s here) stays: with a target
close to it, rounds get small and throughput drops; Flink's default target is 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_RECORDS_PER_PARTITION = 100
"""A read never bounded below this, whatever the rate (a round has a fixed cost)."""


@dataclass
class Debloater:
    target_ms: int
    samples: int = 20
    rate: float | None = None
    """Records per second rounds process, all subtasks together (None: not measured yet;
    reads are then bounded by the source's options only)."""

    def observe(self, rows: int, seconds: float) -> None:
        """A round's stage 2 processed ``rows`` in ``seconds``, submission to collection (what
        an aligned checkpoint waits for: stage 2, the stage-1 tasks beside it on the same
        cores, scheduling). Only a round that had work counts: one with less than half the
        budget was waiting for input, not slow (Flink leaves idle time out of its throughput
        the same way), and counting it would shrink the budget until a burst could not be read."""
        budget = self.budget
        if not rows or seconds <= 0 or (budget is not None and rows < budget / 2):
            return
        sample = rows / seconds
        weight = 2 / (self.samples + 1)  # an exponential moving average over ``samples``
        self.rate = sample if self.rate is None else self.rate + weight * (sample - self.rate)

    @property
    def budget(self) -> int | None:
        """The records a round may read (None: no bound yet)."""
        if self.rate is None:
            return None
        return int(self.rate * self.target_ms / 1000)

    def per_partition(self, partitions: int) -> int | None:
        """The budget shared by ``partitions`` read in the same round."""
        budget = self.budget
        if budget is None or partitions < 1:
            return None
        return max(MIN_RECORDS_PER_PARTITION, budget // partitions)
