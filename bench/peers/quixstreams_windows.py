"""bench/time.py's windowed workload on quixstreams (run in .venv-peers): a 10 s event-time
tumbling window per account over the payments, each window's count and sum of amounts written
to the output topic when it closes.

Settings as bench/peers/quixstreams_job.py's (exactly-once, RocksDB state, commit interval 1 s).
Windows: ``tumbling_window(10 s, grace 0).agg(n=Count(), total=Sum("amount"))
.final(closing_strategy="partition")``, event time from the payment's ``ts`` (the topic's
``timestamp_extractor``). quixstreams closes a window when a later record of its partition (with
this strategy) passes its end, and never at the end of the input: bench/time.py ends every
partition with a record past every window, so that all windows close. Late records are counted
(``on_late``) and reported. The run stops after ``--outputs`` windows were produced
(``Application.run(count=...)``), which commits the last checkpoint.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from typing import Any

from common import EMBEDDED_BROKER_CONSUMER, Clock, arguments, report
from quixstreams import Application
from quixstreams.dataframe.windows import Count, Sum

LATE: list[int] = [0]


def expected_outputs() -> int:
    """``--outputs N`` (the windows the run must produce), taken off the command line before
    `arguments` parses the rest."""
    at = sys.argv.index("--outputs")
    outputs = int(sys.argv[at + 1])
    del sys.argv[at : at + 2]
    return outputs


def count_late(*_: Any) -> bool:
    LATE[0] += 1
    return False  # counted here, not logged


def main() -> None:
    outputs = expected_outputs()
    args = arguments(__doc__ or "")
    clock = Clock()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.name,
        processing_guarantee="exactly-once",
        commit_interval=1.0,
        auto_offset_reset="earliest",
        state_dir=args.work_dir,
        consumer_extra_config=dict(EMBEDDED_BROKER_CONSUMER),
        loglevel="WARNING",
    )
    source = app.topic(
        args.input,
        value_deserializer="json",
        timestamp_extractor=lambda value, _headers, _ts, _type: value["ts"],
    )
    sink = app.topic(args.output, value_serializer="json")
    payments = app.dataframe(source)
    payments = payments.update(lambda _: clock.record_seen())
    windows = (
        payments.tumbling_window(duration_ms=10_000, grace_ms=0, on_late=count_late)
        .agg(n=Count(), total=Sum("amount"))
        .final(closing_strategy="partition")
    )
    windows = windows.apply(
        lambda value, key, _ts, _headers: {
            "account": key.decode(),
            "window_start": value["start"],
            "n": value["n"],
            "total": value["total"],
        },
        metadata=True,
    )
    windows.to_topic(sink)
    app.run(count=outputs, collect=False)
    clock.done = time.monotonic()
    report(
        {
            "first_record": clock.first_record,
            "done": clock.done,
            "late_records": LATE[0],
            "versions": {
                name: importlib.metadata.version(name)
                for name in ("quixstreams", "confluent-kafka", "rocksdict")
            },
        }
    )


if __name__ == "__main__":
    main()
