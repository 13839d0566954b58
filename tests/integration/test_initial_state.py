"""A job's initial state (Spark's ``initialState``, `KeyedFunction.initial_state`) through the
agent: applied once in the first round of a fresh start, never again by a restore (a kill after
the first acknowledged checkpoint, resumed with another parallelism), so the committed output
equals the reference that starts every account from its initial balance exactly once. Runs
through sparkpoint.testing's ``run_job``, as a team's test would."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pytest
from pyspark.sql.streaming.stateful_processor import TimerValues

from sparkpoint.agent.job import Job, KafkaSink, KafkaSource
from sparkpoint.agent.processor import SparkProcessor
from sparkpoint.testing import JobRun, assert_exactly_once, kill_agent
from tests.agent_jobs import Balances

pytestmark = pytest.mark.spark

ACCOUNTS = 40


class Ledger(Balances):
    """Each payment's balance after it: the account's initial balance plus its payments."""

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows), ignore_index=True)
        before = (self.balance.get() or (0,))[0]
        balances = before + frame["amount"].astype("int64").cumsum()
        self.balance.update((int(balances.iloc[-1]),))
        yield pd.DataFrame({"account": key[0], "id": frame["id"], "balance": balances})


def test_the_initial_state_is_applied_once_through_a_kill_and_a_rescaled_resume(
    run_job: Callable[..., JobRun],
) -> None:
    initial = pd.DataFrame(
        {
            "account": [f"acct-{i}" for i in range(ACCOUNTS)],
            "balance": range(1_000, 1_000 + ACCOUNTS),
        }
    )
    payments = [
        {"id": n, "account": f"acct-{n * 7 % ACCOUNTS}", "amount": n % 13 + 1} for n in range(2_000)
    ]
    job = Job(
        name="ledger",
        source=KafkaSource(["payments"], bounded=True, max_records_per_partition=60),
        key="account",
        function=SparkProcessor(Ledger(), initial_state=initial),
        sink=KafkaSink("balances"),
        parallelism=2,
        settings={
            "execution.checkpointing.interval": "1s",
            "execution.checkpointing.min-pause": "0ms",
        },
    )
    balances = dict(zip(initial["account"], initial["balance"], strict=True))
    reference = []
    for p in payments:
        balances[p["account"]] += p["amount"]
        reference.append(
            {"account": p["account"], "id": p["id"], "balance": balances[p["account"]]}
        )

    run = run_job(job, payments, faults=[kill_agent("after-ack", 1, resume_with=3)])

    assert run.runs[0].killed and run.runs[1].parallelism == 3
    assert_exactly_once(run.output, reference)
