"""The card-spend job's tests, as its team writes them with sparkpoint.testing: the keyed
function in the harness (no Spark, no Kafka), then the whole job on a broker and Spark, killed
after a checkpoint and resumed with another parallelism, and on live input through a
coordinator failover. Each compares the committed output with the plain-Python reference."""

from __future__ import annotations

import pandas as pd
from card_spend.jobs import SpendPerCard, job, payments, reference

from sparkpoint.testing import assert_exactly_once, kill_agent, kill_coordinator


def test_the_function_gives_the_reference_across_a_snapshot_and_a_rescale(keyed_harness):
    records = payments(1_000)
    first = keyed_harness(SpendPerCard(), "card", parallelism=2)
    first.process(records[:600])
    snapshot = first.snapshot()
    assert first.state_of("card-0")["spent"] > 0

    second = keyed_harness.restore(snapshot, SpendPerCard(), "card", parallelism=3)
    second.process(records[600:])

    assert_exactly_once(pd.concat([first.output, second.output]), reference(records))


def test_the_job_is_exactly_once_through_a_kill_and_a_resume_with_parallelism_3(run_job):
    records = payments(3_000)

    run = run_job(job(), records, faults=[kill_agent("after-ack", 2, resume_with=3)])

    assert run.runs[0].killed and run.runs[1].parallelism == 3
    assert_exactly_once(run.output, reference(records))


def test_live_input_through_a_coordinator_failover(run_job):
    records = payments(2_000)

    run = run_job(
        job(bounded=False),
        records,
        rate=500,
        faults=[kill_coordinator(after_checkpoints=2)],
        until=len(records),
    )

    assert run.coordinator_kills == 1
    assert_exactly_once(run.output, reference(records))
