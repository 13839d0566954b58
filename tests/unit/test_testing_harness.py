"""sparkpoint.testing's keyed-function harness: the agent's stage-2 code driven by hand, state in
memory. The example job through it must give the plain-Python reference across a snapshot
restored with another parallelism and another max parallelism; event-time timers fire only when
the watermark passes them and survive a rescale; processing time moves TTL and processing-time
timers by hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from sparkpoint.agent.example import PaymentStats, example_job, payments, positive, reference_output
from sparkpoint.agent.job import (
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
)
from sparkpoint.agent.processor import SparkProcessor
from sparkpoint.agent.time.ttl import StateTtlConfig
from sparkpoint.testing import KeyedFunctionHarness
from tests.agent_jobs import Balances, WindowCounts, WindowProcessor

Row = tuple[str, str, int, int]


def rows_of(out: pd.DataFrame) -> list[Row]:
    return sorted((r.kind, r.account, int(r.id), int(r.value)) for r in out.itertuples(index=False))


@pytest.mark.parametrize("max_parallelism", [None, 256], ids=["same", "rekeyed"])
def test_the_example_job_gives_its_reference_across_a_snapshot_restored_with_parallelism_4(
    max_parallelism: int | None,
) -> None:
    events = list(payments(2_000, accounts=100))
    rows = [vars(e) for e in events]
    job = example_job("harness", "in", "out", bounded=True, parallelism=2)
    with KeyedFunctionHarness.of_job(job) as first:
        for i in range(0, 1_000, 250):
            first.process(rows[i : i + 250])
        snapshot = first.snapshot()
        totals = first.state("total")
        restored = KeyedFunctionHarness.restore(
            snapshot, PaymentStats(), "account", parallelism=4, max_parallelism=max_parallelism,
            map=positive,
        )  # fmt: skip
        with restored:
            assert restored.state("total").sort_index().equals(totals.sort_index())
            for i in range(1_000, 2_000, 250):
                restored.process(rows[i : i + 250])
            restored.end_input()
            got = rows_of(pd.concat([first.output, restored.output]))
    assert got == reference_output(events, end_of_input=True)
    assert snapshot.state_bytes > 0 and snapshot.max_parallelism == 128


def test_a_round_returns_its_output_and_state_is_read_per_key() -> None:
    with KeyedFunctionHarness(PaymentStats(), "account", parallelism=2, map=positive) as harness:
        out = harness.process(
            [
                {"id": 1, "account": "a", "amount": 5, "ts": 1_000},
                {"id": 2, "account": "a", "amount": 7, "ts": 2_000},
                {"id": 3, "account": "b", "amount": -1, "ts": 2_000},  # a refund: mapped away
            ]
        )
        assert rows_of(out) == [("total", "a", 1, 5), ("total", "a", 2, 12)]
        assert harness.state_of("a")["total"] == 12
        assert harness.state_of("b")["total"] is None
        assert harness.state_of("a")["window(value=*:count)"] == {0: 2}  # the window [0, 10 s)
        pending = harness.timers()
        assert pending[["account", "timestamp"]].values.tolist() == [["a", 9_999]]
        assert rows_of(harness.process_watermark(9_999)) == [("window", "a", 0, 2)]
        assert harness.state_of("a")["window(value=*:count)"] == {} and harness.timers().empty
        with pytest.raises(KeyError, match="declares"):
            harness.state("nope")
        assert len(harness.take_output()) == 3 and harness.output.empty


def test_event_time_timers_fire_when_the_watermark_passes_them_also_after_a_rescale() -> None:
    function = WindowCounts()
    records = [
        {"account": "a", "ts": 1_000},
        {"account": "a", "ts": 9_000},
        {"account": "b", "ts": 12_000},
    ]
    with KeyedFunctionHarness(function, "account", parallelism=2) as harness:
        assert harness.process(records).empty
        assert harness.process_watermark(9_998).empty  # window [0, 10000) ends at 9,999
        assert list(harness.timers()["timestamp"]) == [9_999, 19_999]
        fired = harness.process_watermark(9_999)
        assert rows_of(fired) == [("window", "a", 0, 2)]
        snapshot = harness.snapshot()
    with KeyedFunctionHarness.restore(snapshot, WindowCounts(), "account", parallelism=3) as after:
        assert after.watermark == 9_999
        assert list(after.timers()["account"]) == ["b"]
        assert after.process_watermark(15_000).empty
        assert rows_of(after.process_watermark(20_000)) == [("window", "b", 10_000, 1)]
        assert after.timers().empty


class Sessions(KeyedFunction):
    """Counts a key's records; a processing-time timer 1 s after its first emits the count. The
    count has a TTL of 5 s."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {
        "count": ValueState("int64", ttl=StateTtlConfig.new_builder(5_000).build())
    }

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        counts = records.groupby("user").size()
        known = counts.index.map(state.value("count")).fillna(0).astype("int64")
        state.update_value("count", pd.Series(counts.to_numpy() + known.to_numpy(), counts.index))
        first = pd.Series(state.current_processing_time + 1_000, index=counts.index[known == 0])
        state.register_processing_time_timers(first)
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        counts = timers["user"].map(state.value("count"))
        return pd.DataFrame({"user": timers["user"], "count": counts.astype("int64")})


def test_processing_time_moves_by_hand_firing_timers_and_expiring_state() -> None:
    with KeyedFunctionHarness(Sessions(), "user", processing_time=10_000) as harness:
        harness.process([{"user": "u"}, {"user": "u"}])
        assert harness.set_processing_time(10_999).empty
        fired = harness.set_processing_time(11_000)
        assert fired.to_dict("records") == [{"user": "u", "count": 2}]
        assert harness.state_of("u")["count"] == 2
        harness.set_processing_time(16_000)  # 6 s after the last write: expired
        harness.process([{"user": "u"}])
        assert harness.state_of("u")["count"] == 1
        with pytest.raises(ValueError, match="forward only"):
            harness.set_processing_time(1)


def test_of_job_takes_the_jobs_keyed_stage() -> None:
    job = example_job("harness", "in", "out", bounded=True, parallelism=3)
    job = type(job)(
        name=job.name, source=KafkaSource(["in"]), key="account", function=job.function,
        sink=KafkaSink("out"), map=job.map, parallelism=3, max_parallelism=64,
    )  # fmt: skip
    harness = KeyedFunctionHarness.of_job(job)
    assert (harness.parallelism, harness.max_parallelism, harness.key) == (3, 64, "account")
    assert [(r.start, r.end) for r in harness.ranges] == [(0, 21), (22, 42), (43, 63)]
    harness.close()


def test_a_spark_stateful_processor_runs_in_the_harness_as_in_a_job() -> None:
    def function() -> SparkProcessor:
        return SparkProcessor(WindowProcessor(), "EventTime", event_time_column="ts")

    with KeyedFunctionHarness(function(), "account", parallelism=2) as harness:
        harness.process([{"account": "a", "ts": 1_000}, {"account": "b", "ts": 15_000}])
        assert rows_of(harness.process_watermark(10_000)) == [("window", "a", 0, 1)]
        snapshot = harness.snapshot()
    with KeyedFunctionHarness.restore(snapshot, function(), "account", parallelism=3) as after:
        assert rows_of(after.process_watermark(30_000)) == [("window", "b", 10_000, 1)]


def test_a_spark_processors_initial_state_is_applied_once_as_twstester_applies_it() -> None:
    initial = pd.DataFrame({"account": ["a", "b", "c"], "balance": [100, 7, 50]})
    rounds = [
        [{"account": "a", "amount": 5}, {"account": "b", "amount": 1}],
        [{"account": "a", "amount": 2}, {"account": "d", "amount": 9}],
        [{"account": "c", "amount": 3}, {"account": "a", "amount": 1}],
    ]
    tester = TwsTester(
        Balances(), initialStatePandas=[(k, g) for k, g in initial.groupby("account")]
    )
    expected = []
    for records in rounds:
        frame = pd.DataFrame(records)
        for key, rows in frame.groupby("account", sort=False):
            out = tester.testInPandas(key, rows.reset_index(drop=True))
            expected += list(zip(out["account"], out["balance"].astype(int), strict=True))

    def function() -> SparkProcessor:
        return SparkProcessor(Balances(), initial_state=initial)

    with KeyedFunctionHarness(function(), "account", parallelism=2) as first:
        first.process(rounds[0])
        first.process(rounds[1])
        snapshot = first.snapshot()
        got = list(first.output.itertuples(index=False, name=None))
    # restored with the same job (so the same initial state): it is not applied again
    with KeyedFunctionHarness.restore(snapshot, function(), "account", parallelism=3) as after:
        after.process(rounds[2])
        got += list(after.output.itertuples(index=False, name=None))
    assert sorted((a, int(b)) for a, b in got) == sorted(expected)
    assert ("a", 108) in got and ("c", 53) in got  # 100 + 5 + 2 + 1, 50 + 3
