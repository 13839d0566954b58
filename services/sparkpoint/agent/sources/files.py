"""The file source, driver side: a bounded source over Parquet or JSON-lines files (any fsspec
URL, glob patterns allowed). Each file is one split ("partition" 0 of a "topic" named by its
URL); its position is the number of rows already read. Row counts are taken at start, so the job
reads every file to its end and then finishes, like a bounded Kafka source."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fsspec.core import url_to_fs

from sparkpoint.agent.job import FileSource
from sparkpoint.agent.sources import EndsEarly, Partition, PlannedRead, SourceMissing
from sparkpoint.agent.sources.backlog import Backlog, RoundBounds
from sparkpoint.agent.time.watermarks import SourceWatermarks

log = logging.getLogger(__name__)


def expand(pattern: str) -> list[str]:
    fs, path = url_to_fs(pattern)
    protocol = pattern.split("://", 1)[0] + "://" if "://" in pattern else ""
    found = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in found]


def count_rows(url: str, format: str) -> int:
    import pyarrow.parquet as pq

    fs, path = url_to_fs(url)
    if format == "parquet":
        with fs.open(path, "rb") as source:
            return int(pq.ParquetFile(source).metadata.num_rows)
    with fs.open(path, "rb") as source:
        return sum(1 for line in source if line.strip())


@dataclass
class FileSourceReader(EndsEarly):
    source: FileSource
    parallelism: int
    positions: dict[Partition, int] = field(default_factory=dict)
    ends: dict[Partition, int] = field(default_factory=dict)
    capped: dict[Partition, bool] = field(default_factory=dict)
    """Unused: a file's row count decides (the interface of `KafkaSourceReader`)."""
    backlog: Backlog = field(default_factory=Backlog)
    """The rows left to read: a file is backlog (FLIP-309)."""
    bounds: RoundBounds | None = None
    """The bounds of the round planned last (`plan`; only its records apply to a file)."""

    def __post_init__(self) -> None:
        files = expand(self.source.path)
        if not files:
            raise SourceMissing(f"file source {self.source.path}: no file matches")
        self.partitions: list[Partition] = [(f, 0) for f in files]
        strategy = self.source.watermark_strategy
        self.watermarks = SourceWatermarks(strategy, self.partitions) if strategy else None
        """The source's event time, when it declares a watermark strategy."""

    @property
    def names(self) -> list[str]:
        return [f for f, _ in self.partitions]

    def start(
        self, restored: dict[Partition, int] | None, event_times: dict[Partition, int] | None = None
    ) -> None:
        if self.watermarks is not None:
            self.watermarks.start(event_times or {}, time.monotonic())
        for partition in self.partitions:
            self.positions[partition] = (restored or {}).get(partition, 0)
            self.ends[partition] = count_rows(partition[0], self.source.format)
        log.info("file source: %d files, %d rows", len(self.partitions), sum(self.ends.values()))
        self.backlog.start(self.positions, self.ends)

    def owner(self, partition: Partition) -> int:
        return self.partitions.index(partition) % self.parallelism

    @property
    def highs(self) -> dict[Partition, int]:
        return self.ends

    def plan(self) -> dict[Partition, PlannedRead]:
        self.bounds = self.backlog.bounds(
            self.positions, self.source.max_records_per_partition, None
        )
        limit = self.bounds.records
        return {
            p: PlannedRead(None, limit) for p in self.partitions if self.positions[p] < self.ends[p]
        }

    def finished(self) -> bool:
        return all(self.positions[p] >= e for p, e in self.ends.items())

    def snapshot(
        self, subtask: int, positions: dict[Partition, int] | None = None
    ) -> dict[str, dict[str, int]]:
        return {
            name: {str(split): offset}
            for (name, split), offset in (positions or self.positions).items()
            if self.owner((name, split)) == subtask
        }

    def close(self) -> None:
        pass
