"""Testing pipelines (issue 42): what sparkpoint.testing costs a team's test suite. Writes
bench/results/testing.json.

- ``harness``: the example job's keyed stage in `KeyedFunctionHarness` (no Spark, Kafka or
  files): ``--records`` payments (20,000 by default) in rounds of ``--round`` records at
  parallelism 2; records per second over the rounds; a snapshot, and its restore at parallelism
  4 (and at max parallelism 256, every key moved to its new key group), each timed; the output
  checked against the example's plain-Python reference. Then the test as docs/testing.md
  writes it (2,000 payments, snapshot at p=2, restore at p=4, end of input), timed whole, in a
  fresh process, with and without its imports (pytest imports a test module when it collects
  it, before the test's own time starts). Goal: that test under 1 s.
- ``run_job``: the example job end to end through ``run_job`` as a user's test calls it (a
  broker, a coordinator process, the agent as ``sparkpoint agent`` on Spark ``local[*]``),
  killed at ``after-ack:2`` and resumed from the latest checkpoint at parallelism 3; seconds
  from the call to the committed output read back, and the same without a fault; checked with
  `assert_exactly_once`. Goal: one kill and resume under 60 s on this machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
from recording import write_results

from sparkpoint.agent.example import PaymentStats, example_job, payments, positive, reference_output
from sparkpoint.testing import KeyedFunctionHarness, assert_exactly_once, kill_agent

ROOT = Path(__file__).resolve().parents[1]

AS_A_TEST = """
import time
started = time.perf_counter()
import pandas as pd
from sparkpoint.agent.example import PaymentStats, example_job, payments, positive, reference_output
from sparkpoint.testing import KeyedFunctionHarness
imported = time.perf_counter()
events = list(payments(2_000, accounts=100))
rows = [vars(e) for e in events]
with KeyedFunctionHarness.of_job(example_job("t", "in", "out", bounded=True)) as first:
    for i in range(0, 1_000, 250):
        first.process(rows[i : i + 250])
    snapshot = first.snapshot()
    with KeyedFunctionHarness.restore(snapshot, PaymentStats(), "account", 4, map=positive) as second:
        for i in range(1_000, 2_000, 250):
            second.process(rows[i : i + 250])
        second.end_input()
        out = pd.concat([first.output, second.output])
got = sorted((r.kind, r.account, int(r.id), int(r.value)) for r in out.itertuples(index=False))
assert got == reference_output(events, end_of_input=True)
print(time.perf_counter() - imported, time.perf_counter() - started)
"""


def rows_of(out: pd.DataFrame) -> list[tuple[str, str, int, int]]:
    return sorted((r.kind, r.account, int(r.id), int(r.value)) for r in out.itertuples(index=False))


def harness(records: int, round_size: int) -> dict[str, Any]:
    events = list(payments(records, accounts=1_000))
    rows = [vars(e) for e in events]
    half = records // 2
    job = example_job("bench", "in", "out", bounded=True, parallelism=2)
    with KeyedFunctionHarness.of_job(job) as first:
        started = time.perf_counter()
        for i in range(0, half, round_size):
            first.process(rows[i : i + round_size])
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        snapshot = first.snapshot()
        snapshot_s = time.perf_counter() - started
        restores: dict[str, Any] = {}
        for label, max_parallelism in (("p2_to_4", None), ("p2_to_4_max_256", 256)):
            started = time.perf_counter()
            second = KeyedFunctionHarness.restore(
                snapshot, PaymentStats(), "account", 4, max_parallelism, positive
            )
            restore_s = time.perf_counter() - started
            started = time.perf_counter()
            for i in range(half, records, round_size):
                second.process(rows[i : i + round_size])
            second.end_input()
            second_s = time.perf_counter() - started
            exact = rows_of(pd.concat([first.output, second.output])) == reference_output(
                events, end_of_input=True
            )
            second.close()
            restores[label] = {
                "restore_ms": round(restore_s * 1000, 1),
                "records_per_second_after": round((records - half) / second_s),
                "exact": exact,
            }
    fresh = subprocess.run(
        [sys.executable, "-c", AS_A_TEST], capture_output=True, text=True, check=True,
        cwd=ROOT, timeout=120,
    )  # fmt: skip
    test_s, with_imports_s = map(float, fresh.stdout.strip().splitlines()[-1].split())
    return {
        "records": records,
        "round_records": round_size,
        "parallelism": 2,
        "records_per_second": round(half / first_s),
        "snapshot_ms": round(snapshot_s * 1000, 1),
        "snapshot_bytes": snapshot.state_bytes,
        "restores": restores,
        "example_test_seconds": round(test_s, 3),
        "example_test_seconds_with_imports": round(with_imports_s, 3),
        "goal_example_test_under_1s": test_s < 1.0,
    }


def run_job(records: int) -> dict[str, Any]:
    from sparkpoint.testing.cluster import JobRunner, kafka_for_tests
    from sparkpoint.testing.containers import coordinator_for_tests

    events = list(payments(records))
    reference = [
        {"kind": k, "account": a, "id": i, "value": v}
        for k, a, i, v in reference_output(events, end_of_input=True)
    ]
    job = example_job("bench-testing", "payments", "stats", bounded=True, parallelism=2)
    source = job.source
    job = type(job)(**{**vars(job), "source": type(source)(**{**vars(source), "max_records_per_partition": 150})})  # fmt: skip
    out: dict[str, Any] = {"records": records}
    with tempfile.TemporaryDirectory() as work, kafka_for_tests(Path(work)) as kafka:
        coordinator = coordinator_for_tests(kafka.bootstrap, Path(work) / "coordinator")
        started = time.perf_counter()
        coordinator.start()
        out["coordinator_start_s"] = round(time.perf_counter() - started, 2)
        out["broker"] = kafka.kind
        runner = JobRunner(kafka, coordinator, Path(work) / "runs")
        try:
            for label, faults in (
                ("clean", []),
                ("kill_after_ack_resume_at_3", [kill_agent("after-ack", 2, resume_with=3)]),
            ):
                started = time.perf_counter()
                run = runner.run(job, [vars(e) for e in events], faults=faults)
                seconds = time.perf_counter() - started
                assert_exactly_once(run.output, reference)
                out[label] = {
                    "seconds": round(seconds, 1),
                    "agent_runs": len(run.runs),
                    "killed": [r.killed for r in run.runs],
                    "output_rows": len(run.output),
                    "exact": True,
                }
        finally:
            coordinator.stop()
    out["goal_kill_and_resume_under_60s"] = out["kill_after_ack_resume_at_3"]["seconds"] < 60
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--round", type=int, default=1_000)
    parser.add_argument("--job-records", type=int, default=3_000)
    args = parser.parse_args()
    results: dict[str, Any] = {"benchmark": "testing", "method": __doc__}
    results["harness"] = harness(args.records, args.round)
    print(
        f"harness: {results['harness']['records_per_second']:,} records/s at p=2, snapshot "
        f"{results['harness']['snapshot_ms']} ms, restores {results['harness']['restores']}; "
        f"the example's test {results['harness']['example_test_seconds']} s "
        f"({results['harness']['example_test_seconds_with_imports']} s with its imports)"
    )
    results["run_job"] = run_job(args.job_records)
    print(f"run_job: {results['run_job']}")
    results["goals"] = {
        "example_harness_test_under_1s": results["harness"]["goal_example_test_under_1s"],
        "kill_and_resume_under_60s": results["run_job"]["goal_kill_and_resume_under_60s"],
    }
    path = write_results("testing", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
