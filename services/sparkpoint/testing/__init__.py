"""Testing sparkpoint jobs: what a pipeline team imports in its own tests.

- `KeyedFunctionHarness`: a keyed function driven by hand (records, watermarks, processing time,
  state per key, snapshots restored with another parallelism), no Spark, Kafka or files;
- `assert_exactly_once`: committed output against a reference, differences named with examples;
- the pytest plugin (`sparkpoint.testing.plugin`, registered through the ``pytest11`` entry
  point): fixtures ``sparkpoint_kafka``, ``sparkpoint_coordinator`` and ``run_job``;
- `SparkpointContainer` (`sparkpoint.testing.containers`): the coordinator in Docker, for
  teams whose CI tests against containers.
"""

from sparkpoint.testing.harness import HarnessSnapshot, KeyedFunctionHarness

__all__ = ["HarnessSnapshot", "KeyedFunctionHarness"]
