"""Event-time windows on timers (services/sparkpoint/agent/time/windows.py), pure: window
assignment as Flink's TimeWindow computes it, and WindowAggregate driven by hand through the
keyed function's calls (records, then the timers the watermark reaches) on a KeyedState."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkpoint.agent.job import KeyedState, declared_state
from sparkpoint.agent.time.windows import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAggregate,
    assign,
)


def test_tumbling_and_sliding_windows_are_assigned_as_flink_assigns_them() -> None:
    tumbling = TumblingEventTimeWindows.of("10s")
    rows, starts = assign(tumbling, np.array([0, 9_999, 10_000, -1]))
    assert rows.tolist() == [0, 1, 2, 3]
    assert starts.tolist() == [0, 0, 10_000, -10_000]
    sliding = SlidingEventTimeWindows.of("10s", "5s")
    rows, starts = assign(sliding, np.array([12_000]))
    assert sorted(starts.tolist()) == [5_000, 10_000] and rows.tolist() == [0, 0]
    offset = TumblingEventTimeWindows.of("1h", "15min")
    assert assign(offset, np.array([0]))[1].tolist() == [-45 * 60_000]
    with pytest.raises(ValueError, match="multiple"):
        SlidingEventTimeWindows.of("10s", "3s")


def state_for(function: WindowAggregate, watermark: int, held: KeyedState | None) -> KeyedState:
    """A round's state: what the last round left (all keys: a test holds them all)."""
    frames = held.frames() if held is not None else {}
    return KeyedState(declared_state(function), frames, watermark, 0, "account")


def fire(function: WindowAggregate, state: KeyedState, watermark: int) -> pd.DataFrame:
    """The timers at or below ``watermark``, fired as stage 2 fires them."""
    state.current_watermark = watermark
    timers = state.event_time_timers()
    due = timers[timers <= watermark].sort_values(kind="stable")
    frame = pd.DataFrame({"account": due.index.to_numpy(dtype=object), "timestamp": due.to_numpy()})
    state.delete_event_time_timers(due)
    return function.on_timer(frame, state)


def test_a_window_is_emitted_once_when_the_watermark_passes_its_end() -> None:
    function = WindowAggregate(
        TumblingEventTimeWindows.of(10), {"n": ("*", "count"), "total": ("amount", "sum")}, "ts"
    )
    records = pd.DataFrame(
        {"account": ["a", "a", "b", "a"], "ts": [1, 5, 3, 12], "amount": [1.0, 2.0, 4.0, 8.0]}
    )
    state = state_for(function, -(2**63), None)
    assert function.process(records, state).empty
    assert fire(function, state, 8).empty
    out = fire(function, state, 9)
    assert out.sort_values("account").to_dict("records") == [
        {"account": "a", "window_start": 0, "window_end": 10, "n": 2, "total": 3.0},
        {"account": "b", "window_start": 0, "window_end": 10, "n": 1, "total": 4.0},
    ]
    assert fire(function, state, 9).empty, "fired once"
    assert state.map("window:n").index.get_level_values(1).tolist() == [10]  # a's next window


def test_late_records_are_dropped_counted_and_emitted_aside_when_asked() -> None:
    function = WindowAggregate(
        TumblingEventTimeWindows.of(10), {"n": ("*", "count")}, "ts", emit_late=True
    )
    state = state_for(function, 20, None)
    out = function.process(pd.DataFrame({"account": ["a", "a"], "ts": [5, 25]}), state)
    assert function.late_records == 1
    assert out.to_dict("records") == [{"account": "a", "ts": 5, "late": True}]


def test_allowed_lateness_fires_again_for_a_late_record_then_cleans_up() -> None:
    function = WindowAggregate(
        TumblingEventTimeWindows.of(10), {"n": ("*", "count")}, "ts", allowed_lateness=5
    )
    state = state_for(function, -(2**63), None)
    function.process(pd.DataFrame({"account": ["a"], "ts": [1]}), state)
    assert fire(function, state, 10)["n"].tolist() == [1]
    state.current_watermark = 12  # within the lateness: the window is emitted again at once
    again = function.process(pd.DataFrame({"account": ["a"], "ts": [2]}), state)
    assert again[["window_start", "n"]].to_dict("records") == [{"window_start": 0, "n": 2}]
    assert fire(function, state, 14).empty  # the cleanup timer: nothing emitted, state gone
    assert state.map("window:n").empty
    state.current_watermark = 15
    function.process(pd.DataFrame({"account": ["a"], "ts": [3]}), state)
    assert function.late_records == 1
