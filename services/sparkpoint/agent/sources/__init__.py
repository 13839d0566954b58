"""Sources: what stage 1 reads: Kafka topics (sources/kafka.py) and files (sources/files.py).
Their driver-side readers share how the input is ended early (stop-with-savepoint --drain)."""

from __future__ import annotations

from dataclasses import dataclass

Partition = tuple[str, int]


class SourceMissing(ValueError):
    """A job's source is not there to read (a topic not created, no file matching): the job
    cannot start, and the message says what to do."""


@dataclass(frozen=True)
class PlannedRead:
    """One partition's part of a round: read up to ``until`` (None: what is there; a bounded
    source's end applies besides), at most ``max_records``."""

    until: int | None
    max_records: int


def share_by_backlog(
    backlog: dict[Partition, int | None], total: int | None
) -> dict[Partition, int]:
    """Spark's ``maxOffsetsPerTrigger``: ``total`` records over the partitions, each its share
    of the whole backlog (at least one record each; an unknown backlog counts as one record).
    Shared even when the backlog seems within the bound: the embedded broker's high watermark
    can count a batch of many records as one, and a read takes the whole batch. Empty when
    there is no such bound."""
    if total is None:
        return {}
    sizes = {p: max(1, lag or 1) for p, lag in backlog.items()}
    whole = sum(sizes.values())
    return {p: max(1, size * total // whole) for p, size in sizes.items()}


class EndsEarly:
    """Ending a reader's input where reading stands, and undoing it. A reader has
    ``positions`` (where each partition stands) and ``ends`` (where each one ends, if it does)."""

    positions: dict[Partition, int]
    ends: dict[Partition, int]

    def end_here(self) -> dict[Partition, int]:
        """Ends the input where reading stands (stop-with-savepoint ``--drain``): nothing
        beyond is read. Returns the ends it replaced, for `resume`."""
        before = dict(self.ends)
        self.ends = {
            p: min(self.ends.get(p, position), position) for p, position in self.positions.items()
        }
        return before

    def resume(self, ends: dict[Partition, int]) -> None:
        """Undoes `end_here` (the drain's savepoint failed before the input ended)."""
        self.ends = ends
