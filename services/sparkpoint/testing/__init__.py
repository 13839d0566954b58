"""Testing sparkpoint jobs: what a pipeline team imports in its own tests.

- `KeyedFunctionHarness`: a keyed function driven by hand (records, watermarks, processing time,
  state per key, snapshots restored with another parallelism), no Spark, Kafka or files;
- `assert_exactly_once`: committed output against a reference, differences named with examples;
- `kill_agent`, `kill_coordinator`: faults for the ``run_job`` fixture;
- the pytest plugin (`sparkpoint.testing.plugin`, registered through the ``pytest11`` entry
  point): fixtures ``sparkpoint_kafka``, ``sparkpoint_coordinator``, ``run_job`` and
  ``keyed_harness``;
- `SparkpointContainer` (`sparkpoint.testing.containers`): the coordinator in Docker, for
  teams whose CI tests against containers.

Names are imported on first use, so that pytest loading the plugin costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkpoint.testing.cluster import (
        AgentRun,
        Fault,
        FaultNotReached,
        JobRun,
        kill_agent,
        kill_coordinator,
    )
    from sparkpoint.testing.containers import SparkpointContainer
    from sparkpoint.testing.exactly_once import ExactlyOnceViolation, assert_exactly_once
    from sparkpoint.testing.harness import HarnessSnapshot, KeyedFunctionHarness

_WHERE = {
    "HarnessSnapshot": "harness",
    "KeyedFunctionHarness": "harness",
    "ExactlyOnceViolation": "exactly_once",
    "assert_exactly_once": "exactly_once",
    "AgentRun": "cluster",
    "Fault": "cluster",
    "FaultNotReached": "cluster",
    "JobRun": "cluster",
    "kill_agent": "cluster",
    "kill_coordinator": "cluster",
    "SparkpointContainer": "containers",
}

__all__ = [
    "AgentRun",
    "ExactlyOnceViolation",
    "Fault",
    "FaultNotReached",
    "HarnessSnapshot",
    "JobRun",
    "KeyedFunctionHarness",
    "SparkpointContainer",
    "assert_exactly_once",
    "kill_agent",
    "kill_coordinator",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkpoint.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparkpoint.testing.{module}"), name)
