"""Event-time windows on timers (services/sparkpoint/agent/time/windows.py), pure: window
assignment as Flink's TimeWindow computes it, and WindowAggregate driven by hand through the
keyed function's calls (records, then the timers the watermark reaches) on a KeyedState."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkpoint.agent.job import KeyedState, declared_state
from sparkpoint.agent.time.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAggregate,
    assign,
    merged_sessions,
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
    # a's next window [10, 20): its count and sum at 10 * 2 and 10 * 2 + 1, in one map state
    assert function.window_state == "window(n=*:count,total=amount:sum)"
    assert state.map(function.window_state).index.get_level_values(1).tolist() == [20, 21]
    assert state.map(function.window_state).tolist() == [1.0, 8.0]


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
    assert state.map(function.window_state).empty
    state.current_watermark = 15
    function.process(pd.DataFrame({"account": ["a"], "ts": [3]}), state)
    assert function.late_records == 1


def sessions(gap: int = 10, lateness: int = 0) -> WindowAggregate:
    return WindowAggregate(
        EventTimeSessionWindows.with_gap(gap),
        {"n": ("*", "count"), "total": ("amount", "sum")},
        "ts",
        allowed_lateness=lateness,
    )


def payments(account: str, *stamps: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"account": account, "ts": list(stamps), "amount": [float(t) for t in stamps]}
    )


def test_a_session_closes_a_gap_after_its_last_record() -> None:
    function = sessions()
    state = state_for(function, -(2**63), None)
    both = pd.concat([payments("a", 1, 5), payments("b", 3)], ignore_index=True)
    assert function.process(both, state).empty
    assert fire(function, state, 11).empty
    assert fire(function, state, 12).to_dict("records") == [
        {"account": "b", "window_start": 3, "window_end": 13, "n": 1, "total": 3.0}
    ]
    assert fire(function, state, 14).to_dict("records") == [
        {"account": "a", "window_start": 1, "window_end": 15, "n": 2, "total": 6.0}
    ]
    assert state.map("session:end").empty and state.event_time_timers().empty


def test_a_record_that_bridges_two_sessions_merges_them_and_moves_their_timers() -> None:
    function = sessions()
    state = state_for(function, -(2**63), None)
    function.process(payments("a", 0, 30), state)  # [0, 10) and [30, 40)
    function.process(payments("a", 10), state)  # touches [0, 10): [0, 20)
    assert sorted(state.map("session:end").to_dict().items()) == [(("a", 0), 20), (("a", 30), 40)]
    function.process(payments("a", 20), state)  # touches both: [0, 40)
    assert state.map("session:end").to_dict() == {("a", 0): 40}
    assert state.event_time_timers().tolist() == [39]
    assert fire(function, state, 38).empty
    assert fire(function, state, 39).to_dict("records") == [
        {"account": "a", "window_start": 0, "window_end": 40, "n": 4, "total": 60.0}
    ]


def test_a_session_fires_again_for_a_record_within_the_lateness_and_drops_one_after() -> None:
    function = sessions(lateness=5)
    state = state_for(function, -(2**63), None)
    function.process(payments("a", 0), state)
    assert fire(function, state, 9)["n"].tolist() == [1]
    state.current_watermark = 12
    assert function.process(payments("a", 4), state).empty  # joins [0, 10): [0, 14)
    again = fire(function, state, 13)  # the merged session fires at its new end
    assert again[["window_start", "window_end", "n"]].to_dict("records") == [
        {"window_start": 0, "window_end": 14, "n": 2}
    ]
    state.current_watermark = 15
    within = function.process(payments("a", 1), state)  # within the lateness: again at once
    assert within[["window_start", "window_end", "n"]].to_dict("records") == [
        {"window_start": 0, "window_end": 14, "n": 3}
    ]
    assert fire(function, state, 17).empty and len(state.map("session:end")) == 1
    assert fire(function, state, 18).empty and state.map("session:end").empty  # cleaned up
    state.current_watermark = 30
    assert function.process(payments("a", 5), state).empty  # its session ended by 19: late
    assert function.late_records == 1


def test_a_session_merge_keeps_the_timer_another_session_shares() -> None:
    """With a lateness above the gap, one session's cleanup timer can be another's end: [0, 10)
    cleans up at 29, where [20, 30) fires. A late record that merges into [0, 10) deletes its
    timers, and [20, 30) must still fire."""
    function = sessions(lateness=20)
    state = state_for(function, -(2**63), None)
    function.process(payments("a", 0, 20), state)
    assert fire(function, state, 12)["window_start"].tolist() == [0]
    state.current_watermark = 12
    assert function.process(payments("a", 9), state).empty  # joins [0, 10): [0, 19)
    fired = fire(function, state, 29)
    assert fired[["window_start", "window_end", "n"]].to_dict("records") == [
        {"window_start": 0, "window_end": 19, "n": 2},
        {"window_start": 20, "window_end": 30, "n": 1},
    ]


def test_a_count_of_a_column_counts_records_in_sessions_too() -> None:
    function = WindowAggregate(
        EventTimeSessionWindows.with_gap(10), {"n": ("amount", "count")}, "ts"
    )
    state = state_for(function, -(2**63), None)
    function.process(payments("a", 5), state)
    function.process(payments("a", 7), state)  # merged into the open session
    assert fire(function, state, 16)["n"].tolist() == [2]


def test_the_window_state_is_named_after_its_aggregates() -> None:
    """A job restored with other aggregates (or the same in another order) declares another
    state, so it never reads values laid out for the old ones."""
    windows = TumblingEventTimeWindows.of(10)
    one = WindowAggregate(windows, {"n": ("*", "count")}, "ts")
    two = WindowAggregate(windows, {"n": ("*", "count"), "top": ("amount", "max")}, "ts")
    swapped = WindowAggregate(windows, {"top": ("amount", "max"), "n": ("*", "count")}, "ts")
    assert len({one.window_state, two.window_state, swapped.window_state}) == 3
    assert set(declared_state(two)) >= {two.window_state}


def test_a_window_of_nan_only_is_still_emitted_and_sums_keep_infinity() -> None:
    function = WindowAggregate(
        TumblingEventTimeWindows.of(10),
        {"top": ("amount", "max"), "total": ("amount", "sum")},
        "ts",
    )
    state = state_for(function, -(2**63), None)
    records = pd.DataFrame(
        {"account": ["a", "b", "b"], "ts": [1, 2, 3], "amount": [np.nan, np.inf, 1.0]}
    )
    function.process(records, state)
    out = fire(function, state, 9).sort_values("account").reset_index(drop=True)
    assert out["account"].tolist() == ["a", "b"]
    assert np.isnan(out["top"][0]) and out["total"][0] == 0.0  # pandas: max NaN, sum 0
    assert out["top"][1] == np.inf and out["total"][1] == np.inf


@pytest.mark.parametrize("seed", range(20))
def test_sessions_merge_as_flinks_merging_of_time_windows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.choice(["a", "b", "c"], 30)
    starts = rng.integers(0, 200, 30)
    ends = starts + rng.integers(1, 20, 30)
    got = merged_sessions(pd.DataFrame({"key": keys, "start": starts, "end": ends}))
    for key in "abc":  # a brute force: merge intersecting windows until none intersect
        mine = [(int(s), int(e)) for k, s, e in zip(keys, starts, ends, strict=True) if k == key]
        merged: list[tuple[int, int]] = []
        for start, end in sorted(mine):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        of = {i: got[i] for i in range(30) if keys[i] == key}
        assert len(set(of.values())) == len(merged)
        for i, session in of.items():
            same = [j for j, other in of.items() if other == session]
            low = min(int(starts[j]) for j in same)
            assert any(low == m[0] for m in merged)
            assert all(
                m[0] <= starts[i] < m[1] or m[0] <= starts[i] <= m[1] for m in merged if m[0] == low
            )


@pytest.mark.parametrize("seed", range(8))
def test_every_aggregate_over_rounds_matches_pandas_groupby(seed: int) -> None:
    """count, sum, min and max of sliding windows over several rounds (NaN amounts among
    them), emitted at the final watermark, against one pandas groupby over all the records."""
    rng = np.random.default_rng(seed)
    function = WindowAggregate(
        SlidingEventTimeWindows.of(20, 10),
        {
            "n": ("*", "count"),
            "total": ("amount", "sum"),
            "low": ("amount", "min"),
            "high": ("amount", "max"),
        },
        "ts",
    )
    amounts = rng.integers(-50, 50, 120).astype("float64")
    amounts[rng.random(120) < 0.2] = np.nan
    records = pd.DataFrame(
        {
            "account": rng.choice(["a", "b", "c", "d"], 120),
            "ts": np.sort(rng.integers(0, 100, 120)),
            "amount": amounts,
        }
    )
    state: KeyedState | None = None
    for start in range(0, 120, 30):
        state = state_for(function, -(2**63), state)
        part = records.iloc[start : start + 30].reset_index(drop=True)
        assert function.process(part, state).empty
    assert state is not None
    out = fire(function, state, 10**6).set_index(["account", "window_start"]).sort_index()
    rows, starts = assign(function.windows, records["ts"].to_numpy())  # type: ignore[arg-type]
    each = records.iloc[rows].assign(window_start=starts)
    want = (
        each.groupby(["account", "window_start"])["amount"]
        .agg(n="size", total="sum", low="min", high="max")
        .sort_index()
    )
    assert out["n"].tolist() == want["n"].tolist()
    for name in ("total", "low", "high"):
        np.testing.assert_allclose(out[name].to_numpy(), want[name].to_numpy(), equal_nan=True)
    assert (out["window_end"] - out.index.get_level_values(1) == 20).all()
