"""bench/time.py's windowed workload on bytewax (run in .venv-peers): a 10 s event-time tumbling
window per account over the payments, each window's count and sum of amounts written to the
output topic when it closes.

Settings as bench/peers/bytewax_job.py's (SQLite recovery in one partition, snapshots every 1 s,
one worker, the source stopping at the end of its partitions), without the snapshot watcher
(no checkpoint figure is taken here). Windows: ``fold_window`` with a ``TumblingWindower`` of
10 s aligned to the epoch (the windows sparkpoint's ``TumblingEventTimeWindows.of("10s")``
makes) and an ``EventClock`` on the payment's ``ts``. bytewax's watermark is one per worker,
the highest timestamp it has seen less a wait: its one worker reads the four partitions in
turns, so the wait must cover how far one partition runs ahead of another, else records are
late; 10 minutes of event time here, and the late records are counted and reported (0 in an
exact run). The clock does not wake the dataflow on system time (``to_system_utc`` None):
windows close on later records and at the end of the input, where bytewax closes them all.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main
from common import EMBEDDED_BROKER_CONSUMER, Clock, arguments, report

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LENGTH = timedelta(seconds=10)
WAIT = timedelta(minutes=10)
LATE: list[int] = [0]


def parse(message: Any) -> tuple[str, tuple[int, int]]:
    value = json.loads(message.value)
    return value["account"], (value["ts"], value["amount"])


def event_time(item: tuple[int, int]) -> datetime:
    return EPOCH + timedelta(milliseconds=item[0])


def encode(fired: tuple[str, tuple[int, tuple[int, int]]]) -> KafkaSinkMessage[bytes, bytes]:
    account, (window_id, (count, total)) = fired
    start = window_id * int(LENGTH.total_seconds() * 1000)
    value = {"account": account, "window_start": start, "n": count, "total": total}
    return KafkaSinkMessage(account.encode(), json.dumps(value).encode())


def count_late(_: Any) -> None:
    LATE[0] += 1


def dataflow(args: Any, source: KafkaSource, clock: Clock) -> Dataflow:
    flow = Dataflow("time-windows")
    messages = op.input("kafka-in", flow, source)
    seen = op.inspect("seen", messages, lambda _step, _m: clock.record_seen())
    payments = op.map("parse", seen, parse)
    windows = win.fold_window(
        "tumbling",
        payments,
        win.EventClock(event_time, wait_for_system_duration=WAIT, to_system_utc=lambda _: None),
        win.TumblingWindower(length=LENGTH, align_to=EPOCH),
        builder=lambda: (0, 0),
        folder=lambda acc, item: (acc[0] + 1, acc[1] + item[1]),
        merger=lambda a, b: (a[0] + b[0], a[1] + b[1]),
    )
    op.inspect("late", windows.late, lambda _step, item: count_late(item))
    op.output(
        "kafka-out",
        op.map("encode", windows.down, encode),
        KafkaSink([args.bootstrap], args.output),
    )
    return flow


def main() -> None:
    args = arguments(__doc__ or "")
    clock = Clock()
    db_dir = Path(args.work_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    init_db_dir(db_dir, 1)
    source = KafkaSource(
        brokers=[args.bootstrap],
        topics=[args.input],
        tail=False,
        add_config=dict(EMBEDDED_BROKER_CONSUMER),
    )
    cli_main(
        dataflow(args, source, clock),
        epoch_interval=timedelta(seconds=1),
        recovery_config=RecoveryConfig(db_dir),
    )
    clock.done = time.monotonic()
    report(
        {
            "first_record": clock.first_record,
            "done": clock.done,
            "late_records": LATE[0],
            "versions": {
                name: importlib.metadata.version(name) for name in ("bytewax", "confluent-kafka")
            },
        }
    )


if __name__ == "__main__":
    main()
