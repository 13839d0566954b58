"""The peers benchmark's workload on quixstreams (run by bench/peers.py in .venv-peers): a
running sum per user, every updated sum written to the output topic.

Settings: ``processing_guarantee="exactly-once"`` (a Kafka transaction per checkpoint holding
the output, the state changelog and the consumer offsets), RocksDB state (the default store),
``commit_interval=1.0``; everything else is quixstreams' default, apart from the consumer
settings the embedded broker needs (``consumer_extra_config``). The run stops once every input
record produced its output (``Application.run(count=...)``), which commits the last checkpoint.

Checkpoint duration: each call of ``quixstreams.checkpointing.Checkpoint.commit`` is timed (the
class is patched before the Application is built). One call is the whole of quixstreams' commit
protocol: flush the sinks, produce the state changelogs, flush the producer (every output record
of the checkpoint delivered), commit the transaction with the consumer offsets, flush RocksDB.
Empty checkpoints are closed, not committed, and are not counted.

``--live`` (bench/latency.py): the input is still being written, so the run does not stop after
``--records`` outputs; it runs until SIGTERM (quixstreams then commits and stops) and prints no
figures. Without it the run is the bounded one above.
"""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from common import EMBEDDED_BROKER_CONSUMER, Clock, arguments, live_option, report
from quixstreams import Application, State
from quixstreams.checkpointing import Checkpoint

COMMIT_DURATIONS_MS: list[float] = []
COMMIT_ENDS: list[float] = []


def time_commits() -> None:
    commit = Checkpoint.commit

    def timed(self: Checkpoint, *args: Any, **kwargs: Any) -> None:
        started = time.monotonic()
        try:
            commit(self, *args, **kwargs)
        finally:
            ended = time.monotonic()
            COMMIT_DURATIONS_MS.append((ended - started) * 1000)
            COMMIT_ENDS.append(ended)

    Checkpoint.commit = timed  # type: ignore[method-assign]


def main() -> None:
    live = live_option()
    args = arguments(__doc__ or "")
    clock = Clock()
    time_commits()
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
    source = app.topic(args.input, value_deserializer="json")
    sink = app.topic(args.output, value_serializer="json")

    def running_sum(value: dict[str, Any], state: State) -> dict[str, Any]:
        clock.record_seen()
        total = state.get("sum", 0) + value["amount"]
        state.set("sum", total)
        return {"user": value["user"], "sum": total}

    app.dataframe(source).apply(running_sum, stateful=True).to_topic(sink)
    if live:
        app.run()
        return
    app.run(count=args.records, collect=False)
    clock.done = time.monotonic()
    report(
        {
            "first_record": clock.first_record,
            "last_commit_end": COMMIT_ENDS[-1] if COMMIT_ENDS else None,
            "done": clock.done,
            "checkpoint_durations_ms": COMMIT_DURATIONS_MS,
            "versions": {
                name: importlib.metadata.version(name)
                for name in ("quixstreams", "confluent-kafka", "rocksdict")
            },
        }
    )


if __name__ == "__main__":
    main()
