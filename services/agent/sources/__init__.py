"""Sources: what stage 1 reads: Kafka topics (sources/kafka.py) and files (sources/files.py).
Their driver-side readers share how the input is ended early (stop-with-savepoint --drain)."""

from __future__ import annotations

Partition = tuple[str, int]


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
