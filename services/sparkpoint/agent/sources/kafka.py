"""The Kafka source, driver side: which partitions exist, which source subtask owns each, where
each one stands, and which have data to fetch. Positions are kept here and in checkpoints, never
committed to a consumer group (Flink's KafkaSource does the same; commits are only a courtesy
there, and none here)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer

from sparkpoint.agent.job import KafkaSource
from sparkpoint.agent.sources import (
    EndsEarly,
    Partition,
    PlannedRead,
    SourceMissing,
    share_by_backlog,
)
from sparkpoint.agent.sources.backlog import Backlog, RoundBounds
from sparkpoint.agent.time.watermarks import SourceWatermarks
from sparkpoint.common.kafka import (
    consumer_config,
    make_admin,
    partition_offsets,
    true_end_offset,
)

log = logging.getLogger(__name__)


@dataclass
class KafkaSourceReader(EndsEarly):
    source: KafkaSource
    bootstrap: str
    parallelism: int
    positions: dict[Partition, int] = field(default_factory=dict)
    ends: dict[Partition, int] = field(default_factory=dict)
    """Bounded sources: the end offset of every partition, taken when the job first started in
    this process and kept across its restarts (as Flink's bounded KafkaSource keeps its stopping
    offsets in its splits): a restart reads up to the same ends, and does not look them up."""

    capped: dict[Partition, bool] = field(default_factory=dict)
    """Partitions whose last read stopped at the per-round limit: readable again at once."""
    highs: dict[Partition, int] = field(default_factory=dict)
    """Each partition's high watermark when the last round was planned (a bounded source's
    end)."""
    tails: dict[Partition, tuple[int, int]] = field(default_factory=dict)
    """A high watermark found behind a partition's position, and the partition's true end then
    (`true_end_offset`): a broker that counts the last batch's base offset (the embedded one)
    reports the same watermark until another batch arrives, and the end is the same too."""
    backlog: Backlog = field(default_factory=Backlog)
    """What the source had to catch up on when it started (FLIP-309)."""
    bounds: RoundBounds | None = None
    """The bounds of the round planned last (`plan`)."""

    def __post_init__(self) -> None:
        config = consumer_config(
            self.bootstrap, client_id="sparkpoint-source-driver", properties=self.source.properties
        )
        self.consumer = Consumer(config)
        self.admin = make_admin(self.bootstrap, self.source.properties)
        """Asks every partition's offsets in one request (`partition_offsets`)."""
        self.read_committed = config.get("isolation.level") == "read_committed"
        self.partitions: list[Partition] = []
        for topic in self.source.topics:
            metadata = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise SourceMissing(f"source topic {topic} does not exist (create it first)")
            self.partitions += [(topic, p) for p in sorted(metadata.partitions)]
        strategy = self.source.watermark_strategy
        self.watermarks = SourceWatermarks(strategy, self.partitions) if strategy else None
        """The source's event time, when it declares a watermark strategy."""

    @property
    def names(self) -> list[str]:
        return list(self.source.topics)

    def start(
        self, restored: dict[Partition, int] | None, event_times: dict[Partition, int] | None = None
    ) -> None:
        """Positions from a checkpoint, else the earliest offset of every partition; with event
        time, the highest event times the checkpoint stored (``event_times``)."""
        if self.watermarks is not None:
            self.watermarks.start(event_times or {}, time.monotonic())
        restored = restored or {}
        fresh = [p for p in self.partitions if p not in restored]
        earliest = partition_offsets(self.admin, fresh, latest=False)
        for partition in self.partitions:
            self.positions[partition] = (
                restored[partition] if partition in restored else earliest[partition]
            )
        if self.source.bounded:
            for partition in self.partitions:
                if partition not in self.ends:
                    self.ends[partition] = true_end_offset(self.consumer, *partition)
            log.info(
                "bounded source: reading up to %s",
                {f"{t}[{p}]": e for (t, p), e in self.ends.items()},
            )
            self.backlog.start(self.positions, self.ends)
        else:
            self.backlog.start(self.positions, self._ends_now())

    def _ends_now(self) -> dict[Partition, int]:
        """Each partition's end now: its high watermark, or its true end where records lie
        beyond the position (the embedded broker's watermark counts the last batch's base
        offset: a topic filled in one batch per partition shows 1)."""
        highs = partition_offsets(self.admin, self.partitions, True, self.read_committed)
        return {
            p: self._true_end(p, high) if high > self.positions[p] else high
            for p, high in highs.items()
        }

    def owner(self, partition: Partition) -> int:
        """The source subtask that reads ``partition`` (round robin over all partitions)."""
        return self.partitions.index(partition) % self.parallelism

    def plan(self) -> dict[Partition, PlannedRead]:
        """The next round's read of every partition with records beyond its position: up to the
        end it has now (Spark plans a micro-batch's end offsets the same way), at most
        ``max_records_per_partition`` records, and ``max_offsets_per_trigger`` shared by backlog.
        The high watermark can only be too low on the embedded broker (it counts the last
        batch's base offset), never too high; the read takes what arrives with the planned end,
        so the rest of that batch is read too. A read that stopped early (`capped`) is read on
        at once, the watermark unasked. While the source processes backlog, the bounds left
        at their defaults grow (`Backlog.bounds`)."""
        self.bounds = self.backlog.bounds(
            self.positions, self.source.max_records_per_partition, self.source.duration_bound_ms
        )
        limit = self.bounds.records
        backlog: dict[Partition, int | None] = {}
        latest = partition_offsets(
            self.admin, [p for p in self.partitions if p not in self.ends], True,
            self.read_committed,
        )  # fmt: skip
        for partition in self.partitions:
            position = self.positions[partition]
            if partition in self.ends:
                self.highs[partition] = self.ends[partition]
                if position < self.ends[partition]:
                    backlog[partition] = self.ends[partition] - position
                continue
            high = latest[partition]
            if high < position:  # never on Apache Kafka: the watermark counts a batch's base
                high = self._true_end(partition, high)
            self.highs[partition] = high
            if high > position:
                backlog[partition] = high - position
            elif self.capped.get(partition):
                backlog[partition] = None  # how much is there is unknown: read what is
        shares = share_by_backlog(backlog, self.source.max_offsets_per_trigger)
        return {
            partition: PlannedRead(
                None if lag is None or partition in self.ends else self.positions[partition] + lag,
                min(limit, shares.get(partition, limit)),
            )
            for partition, lag in backlog.items()
        }

    def _true_end(self, partition: Partition, high: int) -> int:
        """The end of a partition whose high watermark lies behind the position: records past
        the position may still be there (a round that stopped at its limit inside the last
        batch; without this, a read that found nothing left it unread for good, as long as no
        batch arrived: the drain test's hang). Looked up once per watermark."""
        seen = self.tails.get(partition)
        if seen is None or seen[0] != high:
            seen = (high, true_end_offset(self.consumer, *partition))
            self.tails[partition] = seen
        return seen[1]

    def finished(self) -> bool:
        return bool(self.ends) and all(self.positions[p] >= e for p, e in self.ends.items())

    def snapshot(
        self, subtask: int, positions: dict[Partition, int] | None = None
    ) -> dict[str, dict[str, int]]:
        """The positions (``positions``, else where reading stands) of the partitions
        ``subtask`` owns, as ``{topic: {partition: offset}}``."""
        out: dict[str, dict[str, int]] = {}
        for partition, offset in (positions or self.positions).items():
            if self.owner(partition) == subtask:
                out.setdefault(partition[0], {})[str(partition[1])] = offset
        return out

    def close(self) -> None:
        self.consumer.close()
