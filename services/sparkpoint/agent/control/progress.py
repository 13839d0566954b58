"""What the agent reports of its job's progress with every heartbeat: records in and out, their
rates, how long the sources were held back by full channels, and where each source partition
stands against its end (Flink's source metrics: numRecordsIn, numRecordsInPerSecond,
numRecordsOutPerSecond, pendingRecords, backPressuredTimeMsPerSecond, and the time since a
partition last advanced).

The loop updates it between rounds; the heartbeat thread reads it (`report`), under one lock.
Rates are taken over the last `RATE_WINDOW_S` of reports, as Flink's meters average over a
minute-long window of recent seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sparkpoint.agent.sources import Partition
from sparkpoint.common.events import PartitionProgress

RATE_WINDOW_S = 5.0
"""Rates are averaged over this much of the recent past: long enough to smooth over rounds
(a round may take a second), short enough that a stall shows within seconds."""


@dataclass
class PartitionState:
    position: int = 0
    end: int = -1
    records_in: int = 0
    last_advanced_ms: int = 0


@dataclass(frozen=True)
class Sample:
    at: float
    records_in: int
    records_out: int
    held_s: float
    per_partition: dict[Partition, int]


@dataclass
class Progress:
    clock: Callable[[], float] = time.monotonic
    wall_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    records_in: int = 0
    records_out: int = 0
    held_s: float = 0.0
    """Seconds the sources were held back by a full channel, so far."""
    held_since: float | None = None
    partitions: dict[Partition, PartitionState] = field(default_factory=dict)
    samples: deque[Sample] = field(default_factory=deque)
    source_watermark: int = -(2**63)
    watermarks: list[int] = field(default_factory=list)
    """Event time: the sources' watermark and each keyed subtask's (empty: no event time)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, positions: dict[Partition, int]) -> None:
        """A new attempt: counters from zero, partitions where the attempt starts reading."""
        with self.lock:
            self.records_in = self.records_out = 0
            self.source_watermark, self.watermarks = -(2**63), []
            self.held_s, self.held_since = 0.0, None
            self.partitions = {p: PartitionState(position) for p, position in positions.items()}
            self.samples.clear()

    def seen_ends(self, ends: Iterable[tuple[Partition, int]]) -> None:
        """Each partition's end as the source last saw it (high watermarks, a bounded end)."""
        with self.lock:
            for partition, end in ends:
                self.partitions.setdefault(partition, PartitionState()).end = end

    def read(self, partition: Partition, next_offset: int, records: int) -> None:
        """A stage-1 round read ``records`` of ``partition``, up to ``next_offset``."""
        with self.lock:
            state = self.partitions.setdefault(partition, PartitionState())
            if next_offset != state.position:
                state.last_advanced_ms = self.wall_ms()
            state.position = next_offset
            state.end = max(state.end, next_offset) if state.end >= 0 else state.end
            state.records_in += records
            self.records_in += records

    def watermarked(self, source: int, subtasks: list[int]) -> None:
        """Where event time stands: the sources' watermark and each keyed subtask's."""
        with self.lock:
            self.source_watermark, self.watermarks = source, subtasks

    def emitted(self, records: int) -> None:
        with self.lock:
            self.records_out += records

    def held(self, full: bool) -> None:
        """Whether the sources are held back now (a channel is full): the time it lasts counts."""
        now = self.clock()
        with self.lock:
            if full and self.held_since is None:
                self.held_since = now
            elif not full and self.held_since is not None:
                self.held_s += now - self.held_since
                self.held_since = None

    def report(self) -> dict[str, object]:
        """The heartbeat's progress fields (`AgentHeartbeat`)."""
        now = self.clock()
        with self.lock:
            held = self.held_s + (now - self.held_since if self.held_since is not None else 0.0)
            sample = Sample(
                now, self.records_in, self.records_out, held,
                {p: s.records_in for p, s in self.partitions.items()},
            )  # fmt: skip
            self.samples.append(sample)
            while len(self.samples) > 2 and now - self.samples[1].at >= RATE_WINDOW_S:
                self.samples.popleft()
            first = self.samples[0]
            span = now - first.at

            def rate(now_count: float, then: float) -> int:
                return round((now_count - then) / span) if span > 0 else 0

            return {
                "records_in": self.records_in,
                "records_out": self.records_out,
                "records_in_per_second": rate(self.records_in, first.records_in),
                "records_out_per_second": rate(self.records_out, first.records_out),
                "backpressured_ms_per_second": min(1000, rate(held * 1000, first.held_s * 1000)),
                "partitions": [
                    PartitionProgress(
                        topic,
                        number,
                        s.position,
                        s.end,
                        rate(s.records_in, first.per_partition.get((topic, number), 0)),
                        s.last_advanced_ms,
                    )
                    for (topic, number), s in sorted(self.partitions.items())
                ],
                "source_watermark": self.source_watermark,
                "watermarks": list(self.watermarks),
            }
