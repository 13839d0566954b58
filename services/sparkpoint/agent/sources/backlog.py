"""Whether a source is processing backlog (Flink's FLIP-309 ``isProcessingBacklog``), and how
much a round reads meanwhile.

The records a partition already held when the source started (a fresh start, a restart or a
rescale from a checkpoint: what it must catch up on) are its backlog, and a bounded source's
whole input is. The source processes backlog until every partition has been read that far; then
it does not, and never again in that attempt: Flink's sources that report backlog (a hybrid
source's bounded part, a CDC source's snapshot) switch the same way, once.

While a source processes backlog, the job reports it to the coordinator, which checkpoints at
``execution.checkpointing.interval-during-backlog`` instead of the interval (when that is set),
and rounds read more: records read then are already late, so throughput counts more than
latency. A round's bounds left at their defaults start short (`FIRST`: what the first round
reads, the second processes, so the first output comes soon after the start), then grow from
twice the live ones (`LIVE`) by doubling each round to the backlog's (`CATCHING_UP`): a long
backlog is read in rounds of five times as many records, each with a round's fixed cost
(scheduling, a pass over the state it touches). Bounds a job sets are kept in every phase."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkpoint.agent.sources import Partition


@dataclass(frozen=True)
class RoundBounds:
    """How much a round reads of one partition at most."""

    records: int
    duration_ms: int


FIRST = RoundBounds(5_000, 200)
"""The default bounds of a backlog's first two rounds: the first reads a few thousand records a
partition and the second processes them, so the first output follows the start by two short
rounds (bench/peers.py with resident tasks: the first round processed 0.51-0.61 s after the
job's registration, against 0.80-1.41 s with `LIVE` bounds)."""

LIVE = RoundBounds(50_000, 200)
"""A round's default bounds outside backlog: a record read at once is processed at once, and a
round over a short backlog still takes a useful share of it."""

CATCHING_UP = RoundBounds(250_000, 1_000)
"""A round's default bounds while the source processes backlog (measured on the peers workload:
rounds of about 460,000 records instead of 90,000 cut the Python workers' CPU by a quarter)."""


@dataclass
class Backlog:
    """One source's backlog: the offset each partition's backlog ends at."""

    until: dict[Partition, int] = field(default_factory=dict)
    rounds: int = 0
    """Rounds planned while processing backlog (how far the bounds have grown)."""

    def start(self, positions: dict[Partition, int], ends: dict[Partition, int]) -> None:
        """A start from ``positions``: the partitions whose ``ends`` (their end offsets now, or a
        bounded source's end) lie beyond them are behind."""
        self.until = {p: end for p, end in ends.items() if end > positions.get(p, end)}
        self.rounds = 0

    def processing(self, positions: dict[Partition, int]) -> bool:
        """Whether the backlog is still being read (once read, it is over for good)."""
        if self.until and all(positions.get(p, 0) >= end for p, end in self.until.items()):
            self.until = {}
        return bool(self.until)

    def bounds(
        self, positions: dict[Partition, int], records: int | None, duration_ms: int | None
    ) -> RoundBounds:
        """The next round's bounds: a job's own (``records``, ``duration_ms``: None when left at
        the default) in every phase; the defaults, growing from `LIVE` to `CATCHING_UP` while
        the backlog is read."""
        phase = LIVE
        if self.processing(positions):  # the first two rounds short: they make the first output
            growth = 2 ** min(max(0, self.rounds - 1), 8)
            phase = FIRST if self.rounds < 2 else RoundBounds(
                min(CATCHING_UP.records, LIVE.records * growth),
                min(CATCHING_UP.duration_ms, LIVE.duration_ms * growth),
            )  # fmt: skip
            self.rounds += 1
        return RoundBounds(
            phase.records if records is None else records,
            phase.duration_ms if duration_ms is None else duration_ms,
        )


@dataclass
class BacklogReports:
    """What the coordinator was last told of the job's backlog, and which owner of the job was
    told: a registration starts the coordinator's record of the job without backlog, and so
    does a coordinator that takes the job over (its owner epoch is higher)."""

    told: bool = False
    owner_epoch: int = 0

    def news(self, backlog: bool, owner_epoch: int) -> bool:
        """Whether ``backlog`` is news to the job's owner at ``owner_epoch`` (then it counts as
        told)."""
        if backlog == self.told and (not backlog or owner_epoch == self.owner_epoch):
            return False
        self.told, self.owner_epoch = backlog, owner_epoch
        return True
