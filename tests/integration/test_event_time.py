"""Event time on the real broker and real Spark: watermarks made per Kafka partition from the
records' own timestamps, seen by the keyed function only for what its subtask has processed,
stored in every checkpoint, and resumed (also with another parallelism) after a restore."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sparkpoint import MIN_WATERMARK, WatermarkStrategy
from sparkpoint.agent.example import ensure_topic, generate, payments
from sparkpoint.agent.job import (
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
)
from sparkpoint.agent.processor import SparkProcessor
from sparkpoint.agent.runtime import Agent
from sparkpoint.agent.time.windows import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAggregate,
    Windows,
    assign,
)
from sparkpoint.cli.commands import describe_watermark, stored_watermark
from sparkpoint.common.events import JobStatus
from sparkpoint.common.kafka import make_producer
from tests.agent_jobs import FAST_CHECKPOINTS, WINDOW_MS, WindowCounts, WindowProcessor
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import (
    agent_process,
    committed_transactions,
    in_process,
    killed,
    read_output,
    read_tokened,
    run_in_process,
    unique,
)
from tests.running_coordinator import Running, coordinator_in_thread, wait

pytestmark = pytest.mark.spark

PARTITIONS = 4
KILL_RECORDS = 6_000
LIBRARY_RECORDS = 2_000
START_MS = 1_700_000_000_000
Seen = tuple[str, str, int, int]


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("time"))


class Watermarks(KeyedFunction):
    """Emits each record with the watermark its round saw (after ``slow_s``: records queue in
    the channels, and unaligned checkpoints carry them)."""

    def __init__(self, slow_s: float = 0.0, column: str = "ts") -> None:
        self.slow_s = slow_s
        self.column = column

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        time.sleep(self.slow_s)
        return pd.DataFrame(
            {
                "kind": "seen",
                "account": records["account"].astype(str),
                "id": records[self.column].astype("int64"),
                "value": state.current_watermark,
            }
        )


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    """``count`` records from number ``first`` on: record n has event time START + n seconds
    and goes to partition n % PARTITIONS, so each partition's timestamps only rise."""
    producer = make_producer(bootstrap)
    for n in range(first, first + count):
        value = {"account": f"acct-{n % 16:02d}", "ts": START_MS + n * 1000}
        producer.produce(topic, json.dumps(value).encode(), partition=n % PARTITIONS)
    producer.flush(30)


UNALIGNED = {
    "execution.checkpointing.unaligned.enabled": "true",
    "execution.checkpointing.aligned-checkpoint-timeout": "0ms",
    "execution.checkpointing.interval": "300ms",
}


def event_time_job(
    name: str, topic: str, output: str, bounded: bool, parallelism: int,
    settings: dict[str, str] | None = None, slow_s: float = 0.0,
) -> Job:  # fmt: skip
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    return Job(
        name=name,
        source=KafkaSource(
            [topic], bounded=bounded, max_records_per_partition=25, watermark_strategy=strategy
        ),
        key="account",
        function=Watermarks(slow_s),
        sink=KafkaSink(output),
        parallelism=parallelism,
        settings={
            **FAST_CHECKPOINTS,
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            **(settings or {}),
        },
    )


def seen(coordinator: Running, output: str) -> list[Seen]:
    return [row for row in read_output(coordinator.bootstrap, output) if row[0] == "seen"]


def test_each_round_sees_the_watermark_of_what_its_subtask_processed_before_it(
    coordinator: Running, spark: Any
) -> None:
    """Monotonous timestamps per partition: a record is never at or below the watermark its
    round saw (a watermark taken from the source as it stands, not from what the subtask has
    processed, would cover the records of the fetch that raised it). The watermark rises as
    the input is read."""
    topic, output = unique("events"), unique("seen")
    ensure_topic(coordinator.bootstrap, topic, PARTITIONS)
    produce(coordinator.bootstrap, topic, 0, 2_000)
    job = event_time_job(unique("time"), topic, output, bounded=True, parallelism=2)

    status, _ = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED
    rows = seen(coordinator, output)
    assert len(rows) == 2_000
    late = [row for row in rows if row[2] <= row[3]]
    assert not late, f"{len(late)} records at or below their round's watermark, e.g. {late[:3]}"
    watermarks = sorted(row[3] for row in rows)
    assert watermarks[0] == MIN_WATERMARK  # the first round
    assert watermarks[-1] >= START_MS + 1_000 * 1_000, "the watermark rose with the input"


@pytest.mark.parametrize("mode", [pytest.param("aligned", marks=pytest.mark.chaos), "unaligned"])
def test_a_restore_with_another_parallelism_goes_on_from_the_stored_watermark(
    coordinator: Running, spark: Any, mode: str
) -> None:
    """An unbounded job, stopped after a checkpoint that stored a watermark, and restored with
    parallelism 3 (more input meanwhile): no record from the checkpoint's positions on sees a
    watermark below the lowest one the checkpoint stored (the restored job does not start from
    nothing again, where its first round would see the minimum). Unaligned, with records
    queued in the channels at the checkpoint: its channel state is processed with the
    watermark its subtask had before it (Flink's caveat: a watermark is not restored there),
    so no record of it is late after the restore either."""
    topic, output = unique("events"), unique("seen")
    ensure_topic(coordinator.bootstrap, topic, PARTITIONS)
    produce(coordinator.bootstrap, topic, 0, 1_000)
    unaligned = mode == "unaligned"
    job = event_time_job(
        unique("time"), topic, output, bounded=False, parallelism=2,
        settings=UNALIGNED if unaligned else None, slow_s=0.05 if unaligned else 0.0,
    )  # fmt: skip
    first = in_process(job, coordinator, spark)
    stored, channel, directory = run_until_stored(
        first, coordinator, job.id, with_channel_state=unaligned
    )
    lowest = min([s["watermark"]["value"] for s in stored] + channel)
    # what `sparkpoint checkpoints JOB` shows of it
    shown = stored_watermark(str(directory))
    assert shown == min(s["watermark"]["value"] for s in stored)
    assert describe_watermark(shown).endswith("Z)")

    produce(coordinator.bootstrap, topic, 1_000, 400)
    second = in_process(replace(job, parallelism=3), coordinator, spark, restore="latest")
    thread = threading.Thread(target=second.run, daemon=True)
    thread.start()
    try:
        wait(lambda: len(seen(coordinator, output)) >= 1_400, timeout_s=120, what="every record")
    finally:
        second.stop()
        thread.join(60)
    positions = {
        int(partition): offset
        for snapshot in stored
        for partition, offset in snapshot["positions"][topic].items()
    }
    # record n lies at offset n // PARTITIONS of partition n % PARTITIONS: the rows from the
    # checkpoint's positions on were processed after the restore (or after that checkpoint)
    rows = seen(coordinator, output)
    assert len(rows) == 1_400
    numbers = [((row[2] - START_MS) // 1000, row[3]) for row in rows]
    after = [(n, w) for n, w in numbers if n // PARTITIONS >= positions[n % PARTITIONS]]
    assert len(after) > 400, "the restored job re-read from the checkpoint's positions"
    below = [(n, w) for n, w in after if w < lowest]
    assert not below, f"{len(below)} restored records saw a watermark below {lowest}: {below[:3]}"
    late = [row for row in rows if row[2] <= row[3]]
    assert not late, f"{len(late)} records at or below their round's watermark, e.g. {late[:3]}"


def read_past(coordinator: Running, job_id: str, topic: str, offset: int) -> bool:
    """Whether the newest completed checkpoint of ``job_id`` has every partition past
    ``offset``."""
    base = coordinator.root / "checkpoints" / job_id
    done = [d for d in base.glob("chk-*") if (d / "_metadata").exists()]
    if not done:
        return False
    newest = max(done, key=lambda d: int(d.name[4:]))
    try:  # a newer checkpoint may subsume (delete) this one while it is read: ask again
        positions = [
            offset_
            for p in newest.glob("source-*.json")
            for offset_ in json.loads(p.read_text())["positions"].get(topic, {}).values()
        ]
    except FileNotFoundError:
        return False
    return len(positions) == PARTITIONS and min(positions) > offset


def run_until_stored(
    agent: Agent, coordinator: Running, job_id: str, with_channel_state: bool
) -> tuple[list[dict[str, Any]], list[int], Path]:
    """Runs ``agent`` until a completed checkpoint stored a watermark above the minimum (and,
    ``with_channel_state``, records in flight), then stops it; returns that checkpoint's
    source snapshots, the watermarks its channel state records, and a directory with its source
    files as they were read (the checkpoint itself may be subsumed before the stop)."""
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    found: list[dict[str, Any]] = []
    channel: list[int] = []
    where: list[Path] = []

    def stored() -> bool:
        base = coordinator.root / "checkpoints" / job_id
        for directory in sorted(base.glob("chk-*"), key=lambda p: int(p.name[4:]), reverse=True):
            if not (directory / "_metadata").exists():
                continue
            try:  # subsumed (deleted) by a newer checkpoint while it is read: ask again
                snapshots = [json.loads(p.read_text()) for p in directory.glob("source-*.json")]
                manifests = [json.loads(p.read_text()) for p in directory.glob("channel-*.json")]
            except FileNotFoundError:
                return False
            if with_channel_state and not any(m["segments"] for m in manifests):
                return False
            if snapshots and all(s["watermark"]["value"] > MIN_WATERMARK for s in snapshots):
                found[:] = snapshots
                channel[:] = [m["watermark"] for m in manifests if "watermark" in m]
                # its source files as read: a newer checkpoint may subsume it before the stop
                kept = Path(tempfile.mkdtemp(prefix=f"{directory.name}-"))
                for i, snapshot in enumerate(snapshots):
                    (kept / f"source-{i}.json").write_text(json.dumps(snapshot))
                where[:] = [kept]
                return True
            return False
        return False

    try:
        wait(stored, timeout_s=120, what="a checkpoint with a watermark")
    finally:
        agent.stop()
        thread.join(60)
    time.sleep(0.1)
    return found, channel, where[0]


@pytest.mark.chaos  # two agents, about 45 s: `make chaos` (the idleness logic is unit-tested)
def test_kafka_timestamps_make_the_watermark_and_an_idle_partition_stops_holding_it_back(
    coordinator: Running, spark: Any
) -> None:
    """No timestamp column: each record's Kafka timestamp is its event time (column
    ``timestamp``). One of two partitions never gets a record: without idleness the watermark
    stays at the minimum; with an idle timeout of 300 ms it follows the other partition."""
    results: dict[str | None, int] = {}
    shown: dict[str | None, list[dict[str, str]]] = {}
    for idleness in (None, "300ms"):
        topic, output = unique("events"), unique("seen")
        ensure_topic(coordinator.bootstrap, topic, 2)
        producer = make_producer(coordinator.bootstrap)
        for n in range(300):
            value = json.dumps({"account": f"acct-{n % 4}"}).encode()
            producer.produce(topic, value, partition=0, timestamp=START_MS + n * 1000)
        producer.flush(30)
        strategy = WatermarkStrategy.for_monotonous_timestamps()
        if idleness is not None:
            strategy = strategy.with_idleness(idleness)
        job = Job(
            name=unique("kafka-time"),
            source=KafkaSource([topic], max_records_per_partition=20, watermark_strategy=strategy),
            key="account",
            function=Watermarks(slow_s=0.05, column="timestamp"),
            sink=KafkaSink(output),
            settings=FAST_CHECKPOINTS,
        )
        agent = in_process(job, coordinator, spark)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        try:
            wait(lambda o=output: len(seen(coordinator, o)) >= 300, 120, "every record")
            shown[idleness] = shown_watermarks(coordinator, job.id)
        finally:
            agent.stop()
            thread.join(60)
        rows = seen(coordinator, output)
        assert sorted(row[2] for row in rows) == [START_MS + n * 1000 for n in range(300)]
        results[idleness] = max(row[3] for row in rows)
    assert results[None] == MIN_WATERMARK
    assert results["300ms"] > START_MS
    # Flink's REST shape, from the heartbeats: every keyed subtask's input watermark
    assert [w["id"] for w in shown[None]] == ["0.currentInputWatermark", "1.currentInputWatermark"]
    assert {int(w["value"]) for w in shown[None]} == {MIN_WATERMARK}
    assert all(int(w["value"]) > START_MS for w in shown["300ms"]), shown["300ms"]


def shown_watermarks(coordinator: Running, job_id: str) -> list[dict[str, str]]:
    """The keyed stage's watermarks as ``GET /jobs/{id}/vertices/{v}/watermarks`` shows them,
    once a heartbeat carried the watermark the output shows."""
    answer: list[dict[str, str]] = []

    def reported() -> bool:
        with coordinator.client() as client:
            keyed = client.get(f"/jobs/{job_id}").json()["vertices"][1]["id"]
            answer[:] = client.get(f"/jobs/{job_id}/vertices/{keyed}/watermarks").json()
        return len(answer) == 2 and len({w["value"] for w in answer}) >= 1

    wait(reported, 30, "watermarks shown")
    time.sleep(2.5)  # the heartbeat after the last round
    reported()
    return answer


def test_alignment_holds_a_partition_far_ahead_until_the_slow_one_is_read(
    coordinator: Running, spark: Any
) -> None:
    """Partition 1's event times are 10^6 s ahead of partition 0's, the maximum drift 20 s: once
    partition 0 has a watermark, partition 1 is not read while partition 0 has records (a
    bounded input: once partition 0 is read to its end it sets no pace). One key, so the
    output's order is the order of processing: between partition 0's first and last records
    come at most the 10 of partition 1 read together with partition 0's first."""
    topic, output = unique("events"), unique("seen")
    ensure_topic(coordinator.bootstrap, topic, 2)
    producer = make_producer(coordinator.bootstrap)
    for n in range(200):
        for partition, base in ((0, START_MS), (1, START_MS + 10**9)):
            value = json.dumps({"account": "one", "ts": base + n * 1000}).encode()
            producer.produce(topic, value, partition=partition)
    producer.flush(30)
    strategy = (
        WatermarkStrategy.for_monotonous_timestamps()
        .with_timestamp_column("ts")
        .with_watermark_alignment("all", "20s")
    )
    job = Job(
        name=unique("aligned-time"),
        source=KafkaSource(
            [topic], bounded=True, max_records_per_partition=10, watermark_strategy=strategy
        ),
        key="account",
        function=Watermarks(),
        sink=KafkaSink(output),
        settings=FAST_CHECKPOINTS,
    )
    status, _ = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED
    committed = committed_transactions(coordinator.bootstrap)
    ordered = [
        row[2] >= START_MS + 10**9
        for token, row in read_tokened(coordinator.bootstrap, output, json.loads, True)
        if token is None or token in committed
    ]
    assert len(ordered) == 400
    # until the slow partition's first records are read it has no watermark and sets no pace;
    # from then on the one ahead waits, but for what the same read took of it (10 at most)
    first_slow = ordered.index(False)
    last_slow = len(ordered) - 1 - ordered[::-1].index(False)
    ahead_meanwhile = ordered[first_slow:last_slow].count(True)
    assert ahead_meanwhile <= 10, (
        f"{ahead_meanwhile} records of the partition ahead came while the slow one was read"
    )


# --- timers -----------------------------------------------------------------------------------------


def window_input(count: int) -> list[tuple[int, str, int]]:
    """(partition, account, ts): record n at START + n * 100 ms on partition n % PARTITIONS;
    accounts 'early-*' only in the first 5 s of event time."""
    out = []
    for n in range(count):
        early = n * 100 < 5_000
        account = f"early-{n % 3}" if early and n % 2 else f"acct-{n % 7}"
        out.append((n % PARTITIONS, account, START_MS + n * 100))
    return out


def produce_windows(bootstrap: str, topic: str, rows: list[tuple[int, str, int]]) -> None:
    producer = make_producer(bootstrap)
    for partition, account, ts in rows:
        value = json.dumps({"account": account, "ts": ts}).encode()
        producer.produce(topic, value, partition=partition)
    producer.flush(30)


def window_reference(rows: list[tuple[int, str, int]], window_ms: int = WINDOW_MS) -> list[Seen]:
    counts: dict[tuple[str, int], int] = {}
    for _, account, ts in rows:
        start = ts // window_ms * window_ms
        counts[(account, start)] = counts.get((account, start), 0) + 1
    return sorted(("window", a, s, c) for (a, s), c in counts.items())


def windows(coordinator: Running, output: str) -> list[Seen]:
    return [row for row in read_output(coordinator.bootstrap, output) if row[0] == "window"]


def window_job(
    name: str, topic: str, output: str, parallelism: int, slow_s: float,
    window_ms: int = WINDOW_MS,
) -> Job:  # fmt: skip
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    return Job(
        name=name,
        source=KafkaSource(
            [topic], bounded=True, max_records_per_partition=25, watermark_strategy=strategy
        ),
        key="account",
        function=WindowCounts(slow_s, window_ms),
        sink=KafkaSink(output),
        parallelism=parallelism,
        settings={
            **FAST_CHECKPOINTS,
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        },
    )


@pytest.mark.parametrize(
    "spark_processor", [False, True], ids=["keyed-function", "spark-processor"]
)
def test_timers_fire_windows_as_the_watermark_passes_them_exactly_once(
    coordinator: Running, spark: Any, spark_processor: bool
) -> None:
    """Windows by timers on a bounded input: each window's count is emitted once, when the
    watermark passes its end (most before the input ends: the final watermark fires only the
    last ones), including the windows of accounts that send nothing after the first 5 s. The
    same windows written as Spark's StatefulProcessor (`WindowProcessor`, run unchanged by
    `SparkProcessor` on Spark's executors) commit the same."""
    topic, output = unique("events"), unique("windows")
    ensure_topic(coordinator.bootstrap, topic, PARTITIONS)
    rows = window_input(3_000)
    produce_windows(coordinator.bootstrap, topic, rows)
    job = window_job(unique("windows"), topic, output, 2, slow_s=0.0)
    if spark_processor:
        processor = SparkProcessor(WindowProcessor(), "EventTime", event_time_column="ts")
        job = replace(job, function=processor)

    status, _ = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED
    got = windows(coordinator, output)
    assert got == window_reference(rows)
    assert any(a.startswith("early-") for _, a, _, _ in got)


def test_pending_timers_survive_a_restore_with_another_parallelism(
    coordinator: Running, spark: Any
) -> None:
    """Windows longer than the input (every timer fires at its end, with the final watermark);
    stopped after a checkpoint that holds their timers, restored with parallelism 3: every
    window is emitted exactly once, also those of the accounts whose only records came before
    the checkpoint (their timers are found in the restored key groups; the restore does not
    know where timers lie, and reads each key group's once)."""
    topic, output = unique("events"), unique("windows")
    ensure_topic(coordinator.bootstrap, topic, PARTITIONS)
    rows = window_input(3_000)
    produce_windows(coordinator.bootstrap, topic, rows)
    long = 10**9
    job = window_job(unique("windows"), topic, output, 2, slow_s=0.1, window_ms=long)
    first = in_process(job, coordinator, spark)
    thread = threading.Thread(target=first.run, daemon=True)
    thread.start()
    try:  # a checkpoint past every early account's records (partitions of 750 records)
        wait(lambda: read_past(coordinator, job.id, topic, 100), 120, "a checkpoint past 100")
    finally:
        first.stop()
        thread.join(60)

    status, _ = run_in_process(
        replace(job, parallelism=3, function=WindowCounts(window_ms=long)), coordinator, spark,
        restore="latest",
    )  # fmt: skip

    assert status is JobStatus.FINISHED
    got = windows(coordinator, output)
    want = window_reference(rows, long)
    assert got == want, f"{len(got)} windows against {len(want)}: {got[:5]}"


@pytest.mark.chaos  # three agent processes, about 70 s: `make chaos`
def test_timer_output_is_exactly_once_through_kills_and_rescales_2_4_1(
    coordinator: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows by timers over the payments (monotonous ``ts`` per partition), agents run as a
    user runs them: SIGKILLed mid-publish of epoch 2 at parallelism 2, restored at 4 and killed
    after the first completed checkpoint, restored at 1 and run to its end: every window's count
    is committed exactly once (the timers and the watermark travel with their key groups)."""
    topic, output, name = unique("payments"), unique("windows"), unique("timer-kills")
    assert generate(coordinator.bootstrap, topic, KILL_RECORDS) == KILL_RECORDS
    monkeypatch.setenv("TEST_FUNCTION", "windows")
    first = agent_process(
        coordinator, name, topic, output, crash_at="mid-publish:2", slow_ms=300, max_records=50
    )
    assert killed(first), first.stderr[-3000:]
    second = agent_process(
        coordinator, name, topic, output, "--restore", "latest", "--parallelism", "4",
        crash_at="after-complete:1", slow_ms=300, max_records=50,
    )  # fmt: skip
    assert killed(second), second.stderr[-3000:]
    third = agent_process(
        coordinator, name, topic, output, "--restore", "latest", "--parallelism", "1"
    )
    assert third.returncode == 0, third.stderr[-3000:]

    got = windows(coordinator, output)
    want = window_reference(
        [(0, p.account, p.ts) for p in payments(KILL_RECORDS)]  # partitions do not matter here
    )
    assert got == want, f"{len(got)} windows against {len(want)}"


class SessionTimeouts(KeyedFunction):
    """A processing-time timer 500 ms after each key's latest record: it fires once the
    round's processing time passes it, with no record arriving meanwhile."""

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        keys = records["account"].drop_duplicates().to_numpy(dtype=object)
        state.delete_processing_time_timers(state.processing_time_timers())
        due = pd.Series(state.current_processing_time + 500, index=keys)
        state.register_processing_time_timers(due)
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        late = state.current_processing_time - timers["timestamp"]
        return pd.DataFrame(
            {
                "kind": timers["time_domain"].str.lower(),
                "account": timers["account"].to_numpy(),
                "id": timers["timestamp"].to_numpy(),
                "value": late.to_numpy(),
            }
        )


@pytest.mark.chaos  # about 20 s: `make chaos`
def test_processing_time_timers_fire_without_input(coordinator: Running, spark: Any) -> None:
    """Records for four accounts, once: each account's processing-time timer fires once, after
    its time (the rounds' clock passes it though no record arrives), in the PROCESSING_TIME
    domain."""
    topic, output = unique("events"), unique("timeouts")
    ensure_topic(coordinator.bootstrap, topic, 2)
    producer = make_producer(coordinator.bootstrap)
    for n in range(40):
        producer.produce(topic, json.dumps({"account": f"acct-{n % 4}"}).encode(), partition=n % 2)
    producer.flush(30)
    job = Job(
        name=unique("timeouts"), source=KafkaSource([topic]), key="account",
        function=SessionTimeouts(), sink=KafkaSink(output), settings=FAST_CHECKPOINTS,
    )  # fmt: skip
    agent = in_process(job, coordinator, spark)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        fired = lambda: read_output(coordinator.bootstrap, output)  # noqa: E731
        wait(lambda: len(fired()) >= 4, 120, "four timeouts")
        time.sleep(2)  # none fires twice
    finally:
        agent.stop()
        thread.join(60)
    rows = read_output(coordinator.bootstrap, output)
    assert sorted(row[1] for row in rows) == [f"acct-{i}" for i in range(4)]
    assert {row[0] for row in rows} == {"processing_time"}
    assert all(row[3] >= 0 for row in rows), rows  # fired at or after its time


@pytest.mark.parametrize(
    "windows",
    [
        pytest.param(TumblingEventTimeWindows.of("10s"), marks=pytest.mark.chaos),
        SlidingEventTimeWindows.of("10s", "5s"),
    ],
    ids=["tumbling", "sliding"],
)
def test_the_windows_library_counts_and_sums_each_window_exactly(
    coordinator: Running, spark: Any, windows: Windows
) -> None:
    """WindowAggregate over the payments' event time: every (account, window) row equals the
    reference computed in plain Python, emitted once."""
    topic, output = unique("payments"), unique("windowed")
    assert generate(coordinator.bootstrap, topic, LIBRARY_RECORDS) == LIBRARY_RECORDS
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
    job = Job(
        name=unique("library"),
        source=KafkaSource([topic], bounded=True, watermark_strategy=strategy),
        key="account",
        function=WindowAggregate(
            windows, {"n": ("*", "count"), "total": ("amount", "sum")}, timestamp_column="ts"
        ),
        sink=KafkaSink(output),
        settings=FAST_CHECKPOINTS,
    )
    status, _ = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED

    def decode(value: bytes) -> tuple[str, int, int, int]:
        row = json.loads(value)
        return (row["account"], row["window_start"], row["n"], int(row["total"]))

    got = sorted(row for _, row in read_tokened(coordinator.bootstrap, output, decode, True))
    want: dict[tuple[str, int], list[int]] = {}
    for p in payments(LIBRARY_RECORDS):
        _, starts = assign(windows, np.array([p.ts]))
        for start in starts.tolist():
            counts = want.setdefault((p.account, start), [0, 0])
            counts[0] += 1
            counts[1] += p.amount
    assert got == sorted((a, s, n, t) for (a, s), (n, t) in want.items())
