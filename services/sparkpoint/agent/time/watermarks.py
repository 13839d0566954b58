"""The driver's watermark generator for one source (Flink's ``WatermarksWithIdleness`` over a
``BoundedOutOfOrdernessWatermarks`` per split, combined as ``WatermarkOutputMultiplexer``
combines splits, with ``SourceOperator``'s alignment).

Per partition it keeps the highest event time read so far and when the partition last brought a
record. The source's watermark is the lowest of the partitions' watermarks, leaving out idle
partitions (none brought a record for the idle timeout); when every partition is idle it stays
where it is. It never goes back. The highest event times are what a checkpoint stores of the
source's time (beside its positions), so a restore, a rescale and an unaligned restore go on
from where the checkpoint stood.

Stage 2 does not read this watermark directly: each fetch's watermark follows that fetch's
segments through the channels as a mark (`rounds.channels.Channel.mark`), so a subtask's
watermark covers only records it has processed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sparkpoint.agent.sources import Partition
from sparkpoint.agent.time.strategy import MAX_WATERMARK, MIN_WATERMARK, WatermarkStrategy


@dataclass
class SourceWatermarks:
    strategy: WatermarkStrategy
    partitions: list[Partition]
    highest: dict[Partition, int] = field(default_factory=dict)
    """Per partition, the highest event time read so far (absent: none yet)."""
    last_record_s: dict[Partition, float] = field(default_factory=dict)
    """Per partition, when it last brought a record (or when reading started)."""
    current: int = MIN_WATERMARK
    """The source's watermark: the lowest over active partitions, never going back."""
    ended: bool = False

    def start(self, restored: Mapping[Partition, int], now_s: float) -> None:
        """Reading starts (or restarts at a checkpoint whose highest event times are
        ``restored``): every partition counts as active from now."""
        self.highest = {p: t for p, t in restored.items() if p in self.partitions}
        self.last_record_s = dict.fromkeys(self.partitions, now_s)
        self.current = MIN_WATERMARK
        self.ended = False
        self.advance(now_s)

    def observe(self, partition: Partition, highest: int | None, now_s: float) -> None:
        """A fetch of ``partition`` read records whose highest event time is ``highest``
        (None: it read none)."""
        if highest is None:
            return
        self.last_record_s[partition] = now_s
        known = self.highest.get(partition)
        self.highest[partition] = highest if known is None else max(known, highest)

    def idle(self, partition: Partition, now_s: float) -> bool:
        timeout = self.strategy.idle_timeout_ms
        if timeout is None:
            return False
        return (now_s - self.last_record_s.get(partition, now_s)) * 1000 >= timeout

    def partition_watermark(self, partition: Partition) -> int:
        return self.strategy.watermark(self.highest.get(partition))

    def advance(self, now_s: float) -> int:
        """The source's watermark now: the lowest of the active partitions' (all of them idle:
        unchanged), never below what it was. `MAX_WATERMARK` once the input has ended."""
        if self.ended:
            self.current = MAX_WATERMARK
            return self.current
        active = [p for p in self.partitions if not self.idle(p, now_s)]
        if active:
            lowest = min(self.partition_watermark(p) for p in active)
            self.current = max(self.current, lowest)
        return self.current

    def end(self) -> int:
        """A bounded input was read to its end: the final watermark (Flink's MAX_WATERMARK)."""
        self.ended = True
        self.current = MAX_WATERMARK
        return self.current

    def paused(self, now_s: float, finished: Iterable[Partition] = ()) -> set[Partition]:
        """Alignment: the partitions whose watermark is more than the maximum drift ahead of
        the slowest active partition's, not read this round (none without alignment). Idle
        partitions and ``finished`` ones (read to their end) set no pace, as in Flink."""
        drift = self.strategy.max_drift_ms
        if drift is None:
            return set()
        done = set(finished)
        active = [p for p in self.partitions if not self.idle(p, now_s) and p not in done]
        if len(active) < 2:
            return set()
        slowest = min(self.partition_watermark(p) for p in active)
        if slowest == MIN_WATERMARK:
            return set()  # a partition without records yet sets no pace
        return {p for p in active if self.partition_watermark(p) - slowest > drift}

    def snapshot(
        self, partitions: Iterable[Partition], rewound: Mapping[Partition, int | None]
    ) -> dict[str, dict[str, int]]:
        """The highest event times of ``partitions`` at a checkpoint's cut, as
        ``{topic: {partition: ms}}``: ``rewound`` gives those of partitions whose cut lies
        behind where reading stands (None: no record before it)."""
        out: dict[str, dict[str, int]] = {}
        for partition in partitions:
            highest = rewound[partition] if partition in rewound else self.highest.get(partition)
            if highest is not None:
                out.setdefault(partition[0], {})[str(partition[1])] = highest
        return out
