"""Spark's own StatefulProcessor, unchanged, as a job's keyed stage (services/sparkpoint/agent/
processor.py): the same processor fed the same rounds through pyspark's TwsTester (Spark's
in-memory harness for transformWithStateInPandas) and through sparkpoint's stage 2 on real
files and books (value, list and map state, event-time timers fired by the watermark, a
timer deleted and registered again), then a restore with another parallelism in between; the
outputs must be equal."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.streaming.tws_tester import TwsTester

from sparkpoint.agent.processor import SparkProcessor
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.process import ProcessTask, process_subtask
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.common.keygroups import KeyGroupRange, key_group_range, key_groups

MAX_PARALLELISM = 128
IDLE_MS = 3_000


class IdleUsers(StatefulProcessor):
    """Per user: a running count (value state), the largest amount per kind (map state) and
    the event times seen (list state); after ``IDLE_MS`` of event time without a record, one
    summary row and the user's state cleared. Each record moves the user's timer."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")
        self.largest = handle.getMapState("largest", "kind string", "amount long")
        self.seen = handle.getListState("seen", "ts long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        total, latest = 0, 0
        for frame in rows:
            total += len(frame)
            latest = max(latest, int(frame["ts"].max()))
            for kind, amount in zip(frame["kind"], frame["amount"], strict=True):
                known = self.largest.getValue((kind,))
                if known is None or int(amount) > known[0]:
                    self.largest.updateValue((kind,), (int(amount),))
            self.seen.appendList([(int(t),) for t in frame["ts"]])
        count = (self.count.get() or (0,))[0] + total
        self.count.update((count,))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(latest + IDLE_MS)
        yield pd.DataFrame({"user": [key[0]], "kind": ["count"], "value": [count]})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        count = (self.count.get() or (0,))[0]
        largest = sum(v[0] for v in self.largest.values())
        seen = len(list(self.seen.get()))
        self.count.clear()
        self.largest.clear()
        self.seen.clear()
        yield pd.DataFrame(
            {
                "user": [key[0]] * 3,
                "kind": ["idle-count", "idle-largest", "idle-seen"],
                "value": [count, largest, seen],
            }
        )


def rounds_of_input(seed: int) -> list[pd.DataFrame]:
    """Rounds of records over 12 users, event time advancing with gaps that leave users idle."""
    rng = random.Random(seed)
    out, now = [], 1_000
    for _ in range(14):
        rows = []
        for _ in range(rng.randrange(0, 25)):
            now += rng.randrange(0, 400)
            rows.append(
                {
                    "user": f"u{rng.randrange(12)}",
                    "kind": rng.choice(["card", "cash", "wire"]),
                    "amount": rng.randrange(1, 1_000),
                    "ts": now,
                }
            )
        now += rng.choice([0, 0, 5_000])
        out.append(pd.DataFrame(rows, columns=["user", "kind", "amount", "ts"]))
    return out


def watermarks(rounds: list[pd.DataFrame]) -> list[int]:
    """The watermark after each round: the highest event time so far (or the end of its idle
    gap) less 1 ms, never back."""
    found, highest, watermark = [], 0, 0
    for number, frame in enumerate(rounds):
        if len(frame):
            highest = max(highest, int(frame["ts"].max()))
        watermark = max(watermark, highest + (IDLE_MS + 2_000 if number % 5 == 4 else 0) - 1)
        found.append(watermark)
    return found


def through_tws_tester(rounds: list[pd.DataFrame]) -> list[tuple[Any, ...]]:
    tester = TwsTester(IdleUsers(), timeMode="EventTime", eventTimeExtractor=lambda r: r["ts"])
    out: list[pd.DataFrame] = []
    current = 0
    for frame, watermark in zip(rounds, watermarks(rounds), strict=True):
        on_time = frame[frame["ts"] > current]  # Spark calls no key whose rows are all late
        for user in pd.unique(on_time["user"]):
            rows = on_time[on_time["user"] == user].reset_index(drop=True)
            out.append(tester.testInPandas(user, rows))
        if watermark > current:  # the harness takes only a watermark that moves
            out.append(tester.setWatermark(watermark))
        current = watermark
    return rows_of(out)


def rows_of(frames: list[pd.DataFrame]) -> list[tuple[Any, ...]]:
    found = [f for f in frames if len(f)]
    if not found:
        return []
    every = pd.concat(found, ignore_index=True)
    return sorted(zip(every["user"], every["kind"], every["value"].astype(int), strict=True))


def split(parallelism: int) -> list[KeyGroupRange]:
    return [key_group_range(MAX_PARALLELISM, parallelism, i) for i in range(parallelism)]


class Subtasks:
    """sparkpoint's stage 2 at ``parallelism`` subtasks over one set of books: each round's
    records go to the subtask owning their key group, the watermark of the round's end fires
    the timers."""

    def __init__(self, tmp_path: Path, parallelism: int) -> None:
        self.tmp_path = tmp_path
        self.books = StateBackend(str(tmp_path / "state"), materialize_interval_s=1e9)
        self.ranges = split(parallelism)
        self.function = SparkProcessor(IdleUsers(), "EventTime", event_time_column="ts")
        (tmp_path / "channel").mkdir(exist_ok=True)
        self.number = 0

    def round(self, frame: pd.DataFrame, before: int, after: int) -> list[pd.DataFrame]:
        self.number += 1
        frame = frame.assign(**{KEY_GROUP_COLUMN: key_groups(frame["user"].to_numpy(), 128)})
        seq = self.books.seq(self.number)
        out = []
        for subtask, groups in enumerate(self.ranges):
            mine = frame[frame[KEY_GROUP_COLUMN].between(groups.start, groups.end)]
            names = []
            if len(mine):
                names = [f"s-{self.number}-{subtask}"]
                (self.tmp_path / "channel" / names[0]).write_bytes(to_ipc(mine))
            asked = self.books.subtask_state(groups, seq, subtask, float(self.number))
            task = ProcessTask(
                subtask, str(self.tmp_path / "channel"), names, asked,
                self.books.run_path(seq, subtask),
                str(self.tmp_path / f"out-{self.number}-{subtask}.arrow"), key="user",
                watermark=before, watermark_after=after,
                timer_groups=list(range(groups.start, groups.end + 1)),
            )  # fmt: skip
            result = process_subtask(task, self.function)
            self.books.install(asked, result.written, seq, float(self.number))
            if result.output_path:
                out.append(from_ipc(result.output_path))
        return out


@pytest.mark.parametrize("seed", [1, 2])
def test_a_spark_stateful_processor_gives_what_spark_s_own_harness_gives_also_rescaled(
    tmp_path: Path, seed: int
) -> None:
    rounds = rounds_of_input(seed)
    expected = through_tws_tester(rounds)
    assert any(kind == "idle-count" for _, kind, _ in expected), "some users went idle"

    subtasks = Subtasks(tmp_path, parallelism=2)
    out: list[pd.DataFrame] = []
    before = -(2**63)
    for number, (frame, after) in enumerate(zip(rounds, watermarks(rounds), strict=True)):
        if number == 7:  # the same books, read by 3 subtasks: whole key groups move
            subtasks.ranges = split(3)
        out += subtasks.round(frame, before, after)
        before = after
    assert rows_of(out) == expected


def test_a_processor_declares_its_state_and_refuses_timers_without_time() -> None:
    function = SparkProcessor(IdleUsers())
    assert set(function.state) == {"count", "largest", "seen"}
    with pytest.raises(ValueError, match="event_time_column"):
        SparkProcessor(IdleUsers(), "EventTime")
    with pytest.raises(ValueError, match="time_mode"):
        SparkProcessor(IdleUsers(), "Sometimes")
