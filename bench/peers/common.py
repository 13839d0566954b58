"""What the three job scripts of bench/peers.py share (standard library only: they run in two
virtual environments): their command line, the consumer settings the embedded broker needs, and
the one JSON line each prints at its end for the benchmark to read."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

RESULT_PREFIX = "PEERS-RESULT "
"""Marks the line with a job's figures in its stdout (the systems log there too)."""

EMBEDDED_BROKER_CONSUMER = {
    # tansu holds every fetch for the whole fetch.wait.max.ms, and a group join for half the
    # session timeout: librdkafka's defaults (500 ms, 45 s) would make every peer wait on it.
    "fetch.wait.max.ms": 10,
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000,
}


def live_option() -> bool:
    """``--live`` (bench/latency.py: the input is still being written), taken off the command
    line before `arguments` parses the rest."""
    if "--live" not in sys.argv:
        return False
    sys.argv.remove("--live")
    return True


def option(name: str, default: str) -> str:
    """``--name VALUE`` taken off the command line before `arguments` parses the rest (options
    only some job scripts have), or ``default``."""
    flag = f"--{name}"
    if flag not in sys.argv:
        return default
    at = sys.argv.index(flag)
    value = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return value


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True, help="input topic")
    parser.add_argument("--output", required=True, help="output topic")
    parser.add_argument("--records", type=int, required=True, help="records in the input topic")
    parser.add_argument("--work-dir", required=True, help="state, recovery or checkpoint dir")
    parser.add_argument("--name", required=True, help="job name / consumer group, unique per run")
    parser.add_argument(
        "--spark-jobs", action="store_true",
        help="sparkpoint: a Spark job per round, as on a cluster (no resident tasks)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-seconds", type=float, default=0.0,
        help="sparkpoint: run the job this long on an empty topic that stays open (its cost "
        "per second with nothing to process) instead of over --records",
    )  # fmt: skip
    return parser.parse_args()


class Clock:
    """Monotonic marks of one run. CLOCK_MONOTONIC is system-wide on Linux, so the benchmark
    compares them with the moment it launched this process."""

    def __init__(self) -> None:
        self.first_record: float | None = None
        self.done: float | None = None

    def record_seen(self) -> None:
        if self.first_record is None:
            self.first_record = time.monotonic()


def report(figures: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(figures), flush=True)
