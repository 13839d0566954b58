"""Job definitions for agent tests, configured by environment so that an agent process started
as a user would (``sparkpoint agent tests/agent_jobs.py:job``) runs the test's job:
``TEST_JOB_NAME``, ``TEST_INPUT``, ``TEST_OUTPUT`` (a topic, or a directory for the file sink
when ``TEST_SINK=files``), ``TEST_MAX_RECORDS`` (per partition and round), ``TEST_BOUNDED``,
``TEST_SETTINGS`` (job options as JSON), ``TEST_FUNCTION`` (``windows``: 10 s windows by
event-time timers over the payments' ``ts``, `WindowCounts`) and ``TEST_SLOW_MS`` (stage 2 sleeps that long per key
group it processes: the source outruns it and records queue in the channels)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from sparkpoint.agent.example import PaymentStats, example_job
from sparkpoint.agent.job import (
    DeliveryGuarantee,
    FileSink,
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    MapState,
    StateDescriptor,
)
from sparkpoint.agent.time.strategy import WatermarkStrategy

FAST_CHECKPOINTS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.timeout": "60s",
}


def build(
    name: str,
    input_topic: str,
    output: str,
    max_records: int = 500,
    bounded: bool = True,
    sink: str = "kafka",
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
    parallelism: int = 2,
    settings: dict[str, str] | None = None,
) -> Job:
    job = example_job(
        name, input_topic, output, bounded, parallelism, {**FAST_CHECKPOINTS, **(settings or {})}
    )
    chosen = FileSink(output, guarantee) if sink == "files" else KafkaSink(output, guarantee)
    return replace(
        job,
        source=replace(job.source, max_records_per_partition=max_records),
        sink=chosen,
    )


def job() -> Job:
    env = os.environ
    if env.get("TEST_FUNCTION") == "windows":
        return window_job(
            env["TEST_JOB_NAME"], env["TEST_INPUT"], env["TEST_OUTPUT"],
            int(env.get("TEST_MAX_RECORDS", "500")), int(env.get("TEST_SLOW_MS", "0")),
        )  # fmt: skip
    built = build(
        env["TEST_JOB_NAME"],
        env["TEST_INPUT"],
        env["TEST_OUTPUT"],
        int(env.get("TEST_MAX_RECORDS", "500")),
        env.get("TEST_BOUNDED", "1") == "1",
        env.get("TEST_SINK", "kafka"),
        settings=json.loads(env.get("TEST_SETTINGS", "{}")),
    )
    slow_ms = int(env.get("TEST_SLOW_MS", "0"))
    return replace(built, function=Slow(slow_ms)) if slow_ms else built


class Slow(PaymentStats):
    """The example function, sleeping ``slow_ms`` per key group batch: a slow stage 2."""

    def __init__(self, slow_ms: int) -> None:
        self.slow_ms = slow_ms

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(self.slow_ms / 1000)
        return super().process(records, state)


class SlowPerRecord(PaymentStats):
    """The example function, sleeping ``per_record_ms`` for every record it is given: a stage 2
    whose time grows with the round (what buffer debloating measures)."""

    def __init__(self, per_record_ms: float) -> None:
        self.per_record_ms = per_record_ms

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(len(records) * self.per_record_ms / 1000)
        return super().process(records, state)


class FailingOnce(PaymentStats):
    """The example function, failing once when it first sees a payment id at or above
    ``at_id``: the marker file records that it failed (tasks run in other processes), so the
    restarted job gets past that point. With ``after``, only once that file exists."""

    def __init__(self, at_id: int, marker: str, after: str | None = None) -> None:
        self.at_id = at_id
        self.marker = marker
        self.after = after

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        armed = self.after is None or Path(self.after).exists()
        if armed and int(records["id"].max()) >= self.at_id and not Path(self.marker).exists():
            Path(self.marker).write_text("failed once")
            raise RuntimeError(f"scripted failure at payment {self.at_id}")
        return super().process(records, state)


class AlwaysFailing(PaymentStats):
    """Fails every time it sees a payment id at or above ``at_id``; each call takes at least
    ``slow_ms``."""

    def __init__(self, at_id: int, slow_ms: int = 0) -> None:
        self.at_id = at_id
        self.slow_ms = slow_ms

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(self.slow_ms / 1000)
        if int(records["id"].max()) >= self.at_id:
            raise RuntimeError(f"scripted failure at payment {self.at_id}, every time")
        return super().process(records, state)


# --- event time --------------------------------------------------------------------------------

WINDOW_MS = 10_000


class WindowCounts(KeyedFunction):
    """10 s tumbling event-time windows counted per account: a timer at each window's last
    millisecond emits its count once the watermark passes it, also for an account that sends
    nothing more."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {
        "counts": MapState(key_dtype="int64", dtype="int64")
    }

    def __init__(self, slow_s: float = 0.0, window_ms: int = WINDOW_MS) -> None:
        self.slow_s = slow_s
        self.window_ms = window_ms

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(self.slow_s)
        starts = records["ts"].astype("int64") // self.window_ms * self.window_ms
        counts = records.groupby([records["account"].astype(object), starts]).size()
        counts.index = counts.index.set_names(["key", "user_key"])
        known = state.map("counts").reindex(counts.index).fillna(0).astype("int64")
        state.put_in_map("counts", (counts + known).astype("int64"))
        ends = pd.Series(
            counts.index.get_level_values(1) + self.window_ms - 1,
            index=counts.index.get_level_values(0),
        )
        state.register_event_time_timers(ends)
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        starts = timers["timestamp"] + 1 - self.window_ms
        index = pd.MultiIndex.from_arrays(
            [timers["account"].to_numpy(dtype=object), starts.to_numpy()],
            names=["key", "user_key"],
        )
        counts = state.map("counts").reindex(index)
        state.remove_from_map("counts", index)
        return pd.DataFrame(
            {
                "kind": "window",
                "account": timers["account"].to_numpy(),
                "id": starts.to_numpy(),
                "value": counts.fillna(-1).astype("int64").to_numpy(),
            }
        )


class WindowProcessor(StatefulProcessor):
    """`WindowCounts` written as a user writes it for Spark's transformWithStateInPandas: per
    account, counts per 10 s window in map state, an event-time timer at each window's last
    millisecond emitting its count. Run through `SparkProcessor`, it must commit what
    `WindowCounts` commits."""

    def __init__(self, window_ms: int = WINDOW_MS) -> None:
        self.window_ms = window_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.counts = handle.getMapState("counts", "start long", "count long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        for frame in rows:
            starts = frame["ts"].astype("int64") // self.window_ms * self.window_ms
            for start, count in starts.value_counts().items():
                known = self.counts.getValue((int(start),))
                self.counts.updateValue((int(start),), ((known or (0,))[0] + int(count),))
                self.handle.registerTimer(int(start) + self.window_ms - 1)
        return iter([])

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        start = expiredTimerInfo.getExpiryTimeInMs() + 1 - self.window_ms
        count = self.counts.getValue((start,))
        self.counts.removeKey((start,))
        yield pd.DataFrame(
            {"kind": ["window"], "account": [key[0]], "id": [start], "value": [(count or (-1,))[0]]}
        )


def window_job(name: str, topic: str, output: str, max_records: int, slow_ms: int) -> Job:
    """Windows by timers over the payments' ``ts`` (TEST_FUNCTION=windows), bounded."""
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    return Job(
        name=name,
        source=KafkaSource(
            [topic],
            bounded=True,
            max_records_per_partition=max_records,
            watermark_strategy=strategy,
        ),
        key="account",
        function=WindowCounts(slow_ms / 1000),
        sink=KafkaSink(output),
        parallelism=2,
        settings=FAST_CHECKPOINTS,
    )


class Balances(StatefulProcessor):
    """An account's balance: its initial state's ``balance``, then each round's amounts added;
    the balance written for each round an account has records in."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.balance = handle.getValueState("balance", "balance long")

    def handleInitialState(
        self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        self.balance.update((int(initialState["balance"].sum()),))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        total = (self.balance.get() or (0,))[0]
        for frame in rows:
            total += int(frame["amount"].sum())
        self.balance.update((total,))
        yield pd.DataFrame({"account": [key[0]], "balance": [total]})
