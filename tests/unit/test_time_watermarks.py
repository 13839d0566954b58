"""Event time, pure: the strategy's arithmetic (Flink's BoundedOutOfOrdernessWatermarks), the
driver's generator with idleness and alignment on a fake clock, the channels' marks against
barriers, what a restore starts from, timers as keyed state and the driver's timer index."""

from __future__ import annotations

import pandas as pd
import pytest

from sparkpoint import MAX_WATERMARK, MIN_WATERMARK, FileSource, WatermarkStrategy
from sparkpoint.agent.job import TIMERS, KeyedFunction, KeyedState, declared_state
from sparkpoint.agent.recovery.restore import Restored, SubtaskWatermark
from sparkpoint.agent.rounds.channels import Channel, event_times_before, mark_source_watermark
from sparkpoint.agent.time.strategy import event_times
from sparkpoint.agent.time.timers import TimerIndex
from sparkpoint.agent.time.watermarks import SourceWatermarks
from sparkpoint.cli.commands import describe_watermark
from sparkpoint.common.keygroups import KeyGroupRange

A, B = ("t", 0), ("t", 1)


def test_bounded_out_of_orderness_is_the_highest_timestamp_less_the_bound_less_one_ms() -> None:
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("5s")
    assert strategy.watermark(None) == MIN_WATERMARK
    assert strategy.watermark(100_000) == 100_000 - 5_000 - 1
    assert WatermarkStrategy.for_monotonous_timestamps().watermark(7) == 6
    built = (
        strategy.with_timestamp_column("ts")
        .with_idleness("1min")
        .with_watermark_alignment("g", "30s")
    )
    assert (built.column, built.idle_timeout_ms, built.max_drift_ms) == ("ts", 60_000, 30_000)
    assert strategy.column == "timestamp"  # the Kafka record timestamp, as Spark names it


def test_bad_strategies_and_file_sources_without_a_column_are_refused() -> None:
    with pytest.raises(ValueError, match="out-of-orderness"):
        WatermarkStrategy.for_bounded_out_of_orderness(-1)
    with pytest.raises(ValueError, match="idle timeout"):
        WatermarkStrategy.for_monotonous_timestamps().with_idleness(0)
    with pytest.raises(ValueError, match="timestamp column"):
        FileSource("x.parquet", watermark_strategy=WatermarkStrategy.for_monotonous_timestamps())


def test_event_times_take_integers_and_datetimes_and_refuse_the_rest() -> None:
    assert list(event_times(pd.Series([1, 5], name="ts"))) == [1, 5]
    stamps = pd.Series(pd.to_datetime(["1970-01-01T00:00:01.000", "1970-01-01T00:00:02.500"]))
    assert list(event_times(stamps)) == [1000, 2500]
    aware = pd.Series(pd.to_datetime(["1970-01-01T01:00:01+01:00"]))
    assert list(event_times(aware)) == [1000]
    with pytest.raises(TypeError, match="'ts'"):
        event_times(pd.Series(["soon"], name="ts"))


def test_the_source_watermark_is_the_lowest_partitions_and_never_goes_back() -> None:
    clock = SourceWatermarks(WatermarkStrategy.for_bounded_out_of_orderness(10), [A, B])
    clock.start({}, now_s=0.0)
    clock.observe(A, 1_000, now_s=1.0)
    assert clock.advance(1.0) == MIN_WATERMARK  # B has brought nothing: it holds it back
    clock.observe(B, 500, now_s=1.0)
    assert clock.advance(1.0) == 500 - 11
    clock.observe(B, 2_000, now_s=2.0)
    assert clock.advance(2.0) == 1_000 - 11
    clock.observe(A, 400, now_s=3.0)  # an older record does not move a partition back
    assert clock.advance(3.0) == 1_000 - 11
    assert clock.end() == MAX_WATERMARK and clock.advance(4.0) == MAX_WATERMARK


def test_an_idle_partition_stops_holding_the_watermark_back_until_it_brings_a_record() -> None:
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_idleness("5s")
    clock = SourceWatermarks(strategy, [A, B])
    clock.start({}, now_s=0.0)
    clock.observe(A, 1_000, now_s=1.0)
    assert clock.advance(4.9) == MIN_WATERMARK
    assert clock.advance(5.0) == 999  # B idle since the start
    clock.observe(A, 3_000, now_s=6.0)
    clock.observe(B, 2_000, now_s=6.0)  # B active again, behind A
    assert clock.advance(6.0) == 1_999
    assert clock.advance(20.0) == 1_999  # both idle: it stays


def test_alignment_pauses_partitions_far_ahead_of_the_slowest() -> None:
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_watermark_alignment("g", "1s")
    clock = SourceWatermarks(strategy, [A, B])
    clock.start({}, now_s=0.0)
    clock.observe(A, 10_000, now_s=1.0)
    assert clock.paused(1.0) == set()  # B has no records yet: it sets no pace
    clock.observe(B, 8_000, now_s=1.0)
    assert clock.paused(1.0) == {A}
    clock.observe(B, 9_500, now_s=2.0)
    assert clock.paused(2.0) == set()
    clock.observe(A, 20_000, now_s=3.0)
    assert clock.paused(3.0) == {A}
    assert clock.paused(3.0, finished=[B]) == set()  # B read to its end sets no pace


def test_a_restored_source_goes_on_from_its_highest_event_times() -> None:
    clock = SourceWatermarks(WatermarkStrategy.for_monotonous_timestamps(), [A, B])
    clock.start({A: 5_000, B: 7_000, ("other", 0): 1}, now_s=0.0)
    assert clock.current == 4_999
    assert clock.snapshot([A, B], {B: None}) == {"t": {"0": 5_000}}
    assert clock.snapshot([B], {}) == {"t": {"1": 7_000}}


def test_a_mark_is_reached_once_the_segments_before_it_are_processed() -> None:
    channel = Channel(0)
    first = channel.append("a", 10, 100, A, 0)
    channel.mark(100)
    second = channel.append("b", 10, 100, A, 10)
    channel.mark(200)
    channel.mark(150)  # never back
    assert channel.watermark == MIN_WATERMARK
    taken = channel.take(10)
    assert taken == [first] and channel.watermark_at(channel.reach(taken)) == 100
    channel.consumed(taken)
    assert channel.advance(channel.reach(taken)) == 100
    assert channel.reach(channel.take(10)) >= second.sequence
    assert channel.advance(channel.reach([second])) == 200


def test_a_mark_behind_a_barrier_waits_for_it() -> None:
    channel = Channel(0)
    channel.mark(100)
    channel.add_barrier(1)
    channel.mark(200)
    assert channel.advance(channel.reach([])) == 100  # not past the barrier
    barrier = dict(channel.barriers)[1]
    assert channel.watermark_at(barrier) == 100
    channel.remove_barrier(1)
    assert channel.advance(channel.reach([])) == 200


def test_a_restored_mark_goes_behind_the_restored_records() -> None:
    channel = Channel(0, watermark=100)
    channel.mark(300)  # where the snapshot stood after its channel state
    restored = channel.append_restored("r", 5, 50)
    assert channel.watermark_at(restored.sequence - 1) == 100
    assert channel.watermark_at(restored.sequence) == 300


class BoundedInput:
    def __init__(self, watermarks: SourceWatermarks | None) -> None:
        self.watermarks = watermarks
        self.read = False

    def finished(self) -> bool:
        return self.read


@pytest.mark.parametrize("strategy", [None, WatermarkStrategy.for_monotonous_timestamps()])
def test_a_bounded_input_ends_with_the_maximum_watermark_with_or_without_a_strategy(
    strategy: WatermarkStrategy | None,
) -> None:
    clock = SourceWatermarks(strategy, [A]) if strategy is not None else None
    if clock is not None:
        clock.start({}, now_s=0.0)
    source, channels = BoundedInput(clock), [Channel(0), Channel(1)]
    first = mark_source_watermark(source, channels, now=1.0)
    assert first == (None if strategy is None else MIN_WATERMARK)
    assert all(c.watermark_at(c.reach([])) == MIN_WATERMARK for c in channels)
    source.read = True
    assert mark_source_watermark(source, channels, now=2.0) == (
        None if strategy is None else MAX_WATERMARK
    )
    assert all(c.advance(c.reach([])) == MAX_WATERMARK for c in channels)


def test_a_cut_behind_reading_rewinds_the_highest_event_time_with_the_position() -> None:
    channel = Channel(0)
    channel.append("a", 10, 100, A, 0, event_time_before=None)
    channel.append("b", 10, 100, A, 10, event_time_before=1_000)
    assert event_times_before([channel], {A: 10}) == {A: 1_000}
    assert event_times_before([channel], {A: 0}) == {A: None}
    assert event_times_before([channel], {A: 20}) == {}


def test_a_rescaled_subtask_starts_at_the_lowest_watermark_of_its_key_groups() -> None:
    restored = Restored(1, "/x", False)
    restored.watermarks = [
        SubtaskWatermark(0, 63, 1_000, before=800),
        SubtaskWatermark(64, 127, 2_000),
    ]
    assert restored.watermarks_of(KeyGroupRange(0, 31)) == (800, 1_000)
    assert restored.watermarks_of(KeyGroupRange(32, 95)) == (800, 1_000)
    assert restored.watermarks_of(KeyGroupRange(64, 127)) == (2_000, 2_000)
    assert Restored(1, "/x", False).watermarks_of(KeyGroupRange(0, 127)) is None


# --- timers -------------------------------------------------------------------------------------


class WithTimers(KeyedFunction):
    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        return pd.DataFrame()


class WithoutTimers(KeyedFunction):
    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        return pd.DataFrame()


def test_timers_are_keyed_map_state_registered_once_and_deleted_by_timestamp() -> None:
    declared = declared_state(WithTimers())
    assert TIMERS in declared and TIMERS not in declared_state(WithoutTimers())
    state = KeyedState(declared, {})
    state.register_event_time_timers(pd.Series([10, 20, 10], index=["a", "a", "b"]))
    state.register_event_time_timers(pd.Series([10], index=["a"]))  # again: one timer
    timers = state.event_time_timers()
    assert sorted(zip(timers.index, timers, strict=True)) == [("a", 10), ("a", 20), ("b", 10)]
    state.delete_event_time_timers(pd.Series([20, 99], index=["a", "b"]))
    timers = state.event_time_timers()
    assert sorted(zip(timers.index, timers, strict=True)) == [("a", 10), ("b", 10)]
    assert TIMERS in state.changed
    with pytest.raises(TypeError, match="on_timer"):
        KeyedState(declared_state(WithoutTimers()), {}).register_event_time_timers(
            pd.Series([1], index=["a"])
        )


def test_the_timer_index_names_only_key_groups_that_may_be_due() -> None:
    index = TimerIndex()
    index.update({}, {3: 500, 70: 100})
    assert index.due(KeyGroupRange(0, 63), 499) == []
    assert index.due(KeyGroupRange(0, 63), 500) == [3]
    index.update({}, {3: 200})  # a round's keys registered an earlier one: lowered
    index.update({}, {3: 900})  # a later one does not raise the bound
    assert index.earliest[3] == 200
    index.update({3: None, 70: 150}, {})  # read whole: exact, or no timer left
    assert 3 not in index.earliest and index.earliest[70] == 150
    index.restored([1, 2])
    assert index.due(KeyGroupRange(0, 127), MIN_WATERMARK) == [1, 2]


def test_a_stored_watermark_reads_as_a_time_or_as_flinks_bounds() -> None:
    assert describe_watermark(MIN_WATERMARK) == "none yet (Long.MIN_VALUE)"
    assert describe_watermark(MAX_WATERMARK) == "end of input (Long.MAX_VALUE)"
    assert describe_watermark(1_767_225_600_000) == "1767225600000 (2026-01-01T00:00:00.000Z)"
