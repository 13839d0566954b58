"""The peers benchmark's workload on bytewax (run by bench/peers.py in .venv-peers): a running
sum per user (``op.stateful_map``), every updated sum written to the output topic.

Settings: recovery in one SQLite partition (``bytewax.recovery.init_db_dir(dir, 1)``, what
``python -m bytewax.recovery DIR 1`` does), snapshots every 1 s (``epoch_interval``; with
recovery the snapshot interval is the epoch interval), ``cli_main`` as ``python -m bytewax.run``
calls it, with its default of one worker; the Kafka source stops at the end of its partitions
(``tail=False``). Everything else is bytewax's default, apart from the consumer settings the
embedded broker needs (``add_config``). bytewax's KafkaSink is not transactional: state and
input positions are recovered exactly, output after a resume is at-least-once.

Snapshot duration: bytewax has no figure for it (its snapshot_duration_seconds metric times one
``snapshot()`` call of one key or partition, not the epoch's snapshot). A bytewax snapshot is a
stream: at the end of each epoch every source partition snapshots its offset and every key
touched in the epoch snapshots its state; the recovery writers store them in SQLite, then the
worker's frontier in the ``fronts`` table, from which a resume starts (bytewax's
``resume_from``: epochs below it are not replayed). Measured here, per epoch e: from the
moment the input closed e (the last source partition's ``snapshot()`` call for e, wrapped) to
the moment ``fronts`` first shows a frontier above e (read every 50 ms by frontier_watcher.py, a
process of its own that costs under 1% of a core, so up to 50 ms late; SQLite's WAL lets it
read while bytewax writes): Flink's trigger-to-completed span.

``--live`` (bench/latency.py): the input is still being written, so the source waits for more
at the end of its partitions (``tail=True``) and the dataflow runs until the process is stopped;
no snapshot durations are measured (no watcher) and no figures are printed. Without it the run
is the bounded one above.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.inputs import StatefulSourcePartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from common import EMBEDDED_BROKER_CONSUMER, Clock, arguments, live_option, report


class TimedPartition(StatefulSourcePartition[Any, Any]):
    """A Kafka source partition that notes when it sees its first record and when it ends each
    epoch (bytewax calls ``snapshot`` exactly then)."""

    def __init__(self, inner: StatefulSourcePartition[Any, Any], clock: Clock) -> None:
        self.inner = inner
        self.clock = clock
        self.epoch_ends: list[float] = []

    def next_batch(self) -> Any:
        batch = self.inner.next_batch()
        if batch:
            self.clock.record_seen()
        return batch

    def next_awake(self) -> datetime | None:
        return self.inner.next_awake()

    def snapshot(self) -> Any:
        self.epoch_ends.append(time.monotonic())
        return self.inner.snapshot()

    def close(self) -> None:
        self.inner.close()


class TimedKafkaSource(KafkaSource):
    def __init__(self, clock: Clock, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.parts: list[TimedPartition] = []

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> TimedPartition:
        part = TimedPartition(super().build_part(step_id, for_part, resume_state), self.clock)
        self.parts.append(part)
        return part

    def epoch_closes(self) -> list[float]:
        """When the input closed each epoch (from the first of this execution): the latest of
        the partitions still open then (a partition at its end stops taking part)."""
        longest = max((len(p.epoch_ends) for p in self.parts), default=0)
        return [
            max(p.epoch_ends[i] for p in self.parts if len(p.epoch_ends) > i)
            for i in range(longest)
        ]


def snapshot_durations_ms(
    closes: list[float], first_epoch: int, frontiers: dict[int, float]
) -> list[float]:
    """Epoch first_epoch + i closed at closes[i]; a resume skips it once the frontier is
    above it."""
    durations = []
    for i, closed in enumerate(closes):
        epoch = first_epoch + i
        durable = [seen for frontier, seen in frontiers.items() if frontier > epoch]
        if durable:
            durations.append((min(durable) - closed) * 1000)
    return durations


def dataflow(args: Any, source: KafkaSource) -> Dataflow:
    flow = Dataflow("peers-running-sum")
    messages = op.input("kafka-in", flow, source)
    amounts = op.map("parse", messages, parse)
    sums = op.stateful_map("running-sum", amounts, add)
    records = op.map("encode", sums, encode)
    op.output("kafka-out", records, KafkaSink([args.bootstrap], args.output))
    return flow


def parse(message: Any) -> tuple[str, int]:
    value = json.loads(message.value)
    return value["user"], value["amount"]


def add(total: int | None, amount: int) -> tuple[int, int]:
    total = (total or 0) + amount
    return total, total


def encode(user_sum: tuple[str, int]) -> KafkaSinkMessage[bytes, bytes]:
    user, total = user_sum
    return KafkaSinkMessage(user.encode(), json.dumps({"user": user, "sum": total}).encode())


def main() -> None:
    live = live_option()
    args = arguments(__doc__ or "")
    clock = Clock()
    db_dir = Path(args.work_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    init_db_dir(db_dir, 1)
    (db,) = db_dir.glob("*.sqlite3")
    source = TimedKafkaSource(
        clock,
        brokers=[args.bootstrap],
        topics=[args.input],
        tail=live,
        add_config=dict(EMBEDDED_BROKER_CONSUMER),
    )
    if live:
        cli_main(
            dataflow(args, source),
            epoch_interval=timedelta(seconds=1),
            recovery_config=RecoveryConfig(db_dir),
        )
        return
    watcher = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("frontier_watcher.py")), str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    cli_main(
        dataflow(args, source),
        epoch_interval=timedelta(seconds=1),
        recovery_config=RecoveryConfig(db_dir),
    )
    clock.done = time.monotonic()
    time.sleep(0.02)  # the watcher reads the last frontier row
    seen = json.loads(watcher.communicate(timeout=30)[0])
    first_epoch = seen["first_epoch"]
    frontiers = {int(frontier): at for frontier, at in seen["frontiers"].items()}
    durations = snapshot_durations_ms(source.epoch_closes(), first_epoch, frontiers)
    report(
        {
            "first_record": clock.first_record,
            "done": clock.done,
            "checkpoint_durations_ms": durations,
            "epochs": len(source.epoch_closes()),
            "epoch_closes": source.epoch_closes(),
            "first_epoch": first_epoch,
            "frontiers_seen": frontiers,
            "watcher_cpu_share": round(seen["cpu_seconds"] / seen["seconds"], 4),
            "versions": {
                name: importlib.metadata.version(name) for name in ("bytewax", "confluent-kafka")
            },
        }
    )


if __name__ == "__main__":
    main()
