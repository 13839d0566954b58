"""What the agent's Spark tasks import, imported by the warm-up (`SparkJobs.warm_up`) in every
Python worker before the job registers.

A reused worker imports a task's modules when it unpickles its first task: the rounds, the sink
and the restore modules, and with them pandas, pyarrow, numpy and confluent-kafka, about 1 s of
CPU per worker (py-spy over the workers, bench/peers.py: 14% of their samples in the first 12 s
of a run). Paid in the warm-up it is part of the start-up, spent while the driver is waiting for
the warm-up anyway, not in the first round. Forking the workers from a daemon that imported
them once would save the repeat, but pandas and pyarrow start threads when imported, and
PySpark's daemon imports its worker module after the fork for that reason.
"""

from __future__ import annotations

import importlib
import sys

TASK_MODULES = (
    "sparkpoint.agent.rounds.rounds",
    "sparkpoint.agent.sinks.kafka",
    "sparkpoint.agent.recovery.split",
)


def preload(_: object = None) -> int:
    """Imports `TASK_MODULES` in this process (a warm-up task's body); returns how many modules
    that imported (0 when a task before did it already)."""
    loaded = len(sys.modules)
    for name in TASK_MODULES:
        importlib.import_module(name)
    return len(sys.modules) - loaded
