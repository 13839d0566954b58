"""Event-time windows on timers (Flink's ``TumblingEventTimeWindows``,
``SlidingEventTimeWindows``, ``EventTimeSessionWindows``, allowed lateness and late data), as a keyed function a job uses
whole or a subclass extends::

    job = Job(..., key="account",
              function=WindowAggregate(TumblingEventTimeWindows.of("10s"),
                                       {"payments": ("amount", "count"),
                                        "total": ("amount", "sum")},
                                       timestamp_column="ts",
                                       allowed_lateness="5s"))

A record goes to every window it falls in (one when tumbling, ``size / slide`` when sliding;
sessions merge as it joins them: `EventTimeSessionWindows`).
A window's aggregates are kept together per key in one map state, named after them
(``window(n=*:count,total=amount:sum)``: a job restored with other aggregates declares another
state): its user key is the window start times the number of aggregates plus the aggregate's
position (a window of a count and a sum starting at 10,000 keeps its count at 20,000 and its sum
at 20,001), so that a round reads and writes one state, not one per aggregate. A window is
emitted once the watermark passes its end: one row per key and window, with the key column,
``window_start``, ``window_end`` (exclusive) and the aggregates. With allowed lateness, a
record that arrives after its window fired but within the lateness updates the window and emits
it again at once (Flink's default trigger fires again for each late element); the window's
state goes when the watermark passes its end plus the lateness. A record later than that is
late: dropped and counted (``WindowAggregate.late_records`` of the task), or emitted as it came
with ``late`` true: in the main output with ``emit_late``, or to a side output of the sink with
``late_output`` (Flink's ``sideOutputLateData``; ``KafkaSink(side_outputs={"late": topic})``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from sparkpoint.agent.job import (
    SIDE_OUTPUT,
    KeyedFunction,
    KeyedState,
    MapState,
    StateDescriptor,
    entry_index,
)
from sparkpoint.agent.time.strategy import event_times
from sparkpoint.common.options import parse_duration

AGGREGATES = ("count", "sum", "min", "max")
"""What a window keeps per aggregate; ``mean`` is not kept (a sum and a count give it)."""
WINDOW = "window"
"""The map state of every window's aggregates, (key, start * aggregates + position) -> value,
is named after it and its aggregates (`window_state_name`)."""
SESSION_END = "session:end"
"""Session windows: (key, session start) -> its end (exclusive: its last record + the gap)."""


@dataclass(frozen=True)
class TumblingEventTimeWindows:
    size_ms: int
    offset_ms: int = 0

    @staticmethod
    def of(size: str | int, offset: str | int = 0) -> TumblingEventTimeWindows:
        windows = TumblingEventTimeWindows(parse_duration(size), parse_duration(offset))
        if windows.size_ms < 1 or not 0 <= windows.offset_ms < windows.size_ms:
            raise ValueError("a window's size must be positive and its offset within it")
        return windows

    @property
    def slide_ms(self) -> int:
        return self.size_ms


@dataclass(frozen=True)
class SlidingEventTimeWindows:
    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    @staticmethod
    def of(size: str | int, slide: str | int, offset: str | int = 0) -> SlidingEventTimeWindows:
        windows = SlidingEventTimeWindows(
            parse_duration(size), parse_duration(slide), parse_duration(offset)
        )
        if windows.slide_ms < 1 or windows.size_ms < windows.slide_ms:
            raise ValueError("a sliding window's slide must be positive and at most its size")
        if windows.size_ms % windows.slide_ms:
            raise ValueError("a sliding window's size must be a multiple of its slide")
        if not 0 <= windows.offset_ms < windows.slide_ms:
            raise ValueError("a window's offset must lie within its slide")
        return windows


@dataclass(frozen=True)
class EventTimeSessionWindows:
    """A key's records whose ``[timestamp, timestamp + gap)`` windows touch or overlap make
    one session (Flink's ``EventTimeSessionWindows.withGap`` and its ``TimeWindow.mergeWindows``):
    a session ends a gap after its last record, and a record that bridges two sessions merges
    them."""

    gap_ms: int

    @staticmethod
    def with_gap(gap: str | int) -> EventTimeSessionWindows:
        windows = EventTimeSessionWindows(parse_duration(gap))
        if windows.gap_ms < 1:
            raise ValueError("a session gap must be positive")
        return windows


Windows = TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows
FixedWindows = TumblingEventTimeWindows | SlidingEventTimeWindows


def assign(windows: FixedWindows, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, window start) for every window each timestamp falls in (Flink's
    ``TimeWindow.getWindowStartWithOffset``)."""
    slide, size, offset = windows.slide_ms, windows.size_ms, windows.offset_ms
    last = timestamps - (timestamps - offset) % slide
    per = size // slide
    rows = np.repeat(np.arange(len(timestamps)), per)
    starts = np.repeat(last, per) - np.tile(np.arange(per, dtype=np.int64) * slide, len(timestamps))
    return rows, starts


class WindowAggregate(KeyedFunction):
    state: ClassVar[Mapping[str, StateDescriptor]] = {}

    def __init__(
        self,
        windows: Windows,
        aggregates: Mapping[str, tuple[str, str]],
        timestamp_column: str = "timestamp",
        allowed_lateness: str | int = 0,
        emit_late: bool = False,
        late_output: str | None = None,
    ) -> None:
        for name, (_, how) in aggregates.items():
            if how not in AGGREGATES:
                raise ValueError(f"aggregate {name!r}: {how!r} is not one of {AGGREGATES}")
        self.windows = windows
        self.aggregates = dict(aggregates)
        self.timestamp_column = timestamp_column
        self.lateness_ms = parse_duration(allowed_lateness)
        self.emit_late = emit_late or late_output is not None
        self.late_output = late_output
        """A side output of the sink (`KafkaSink.side_outputs`) late records go to."""
        self.late_records = 0
        self.hows = [how for _, how in self.aggregates.values()]
        self.window_state = window_state_name(self.aggregates)
        # declared per instance (KeyedFunction.state is read from the function, not its class)
        self.state = {self.window_state: MapState("int64", "float64")}  # type: ignore[misc]
        if isinstance(windows, EventTimeSessionWindows):
            self.state[SESSION_END] = MapState("int64", "int64")

    # --- records ------------------------------------------------------------------------------------

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        if isinstance(self.windows, EventTimeSessionWindows):
            return self.process_sessions(records, state, self.windows)
        key_column = state.key_column
        stamps = event_times(records[self.timestamp_column])
        rows, starts = assign(self.windows, stamps)
        ends = starts + self.windows.size_ms
        watermark = state.current_watermark
        late = ends - 1 + self.lateness_ms <= watermark
        out = self.late(records, rows[late])
        rows, starts, ends = rows[~late], starts[~late], ends[~late]
        if not len(rows):
            return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
        group, index = window_groups(records[key_column].to_numpy(dtype=object)[rows], starts)
        parts = np.column_stack(
            [
                aggregate(how, group, len(index), None if column == "*" else records[column], rows)
                for column, how in self.aggregates.values()
            ]
        )
        merged = combine(self.hows, self.values(index, state), parts)
        state.put_in_map(self.window_state, pd.Series(merged.ravel(), index=self.entries(index)))
        window_ends = index.get_level_values(1).to_numpy() + self.windows.size_ms
        timers = pd.Series(window_ends - 1, index=index.get_level_values(0))
        fired_late = window_ends - 1 <= watermark  # within the lateness: emitted again now
        state.register_event_time_timers(timers[~fired_late])  # a fired window's timer is gone
        if self.lateness_ms:
            state.register_event_time_timers(timers + self.lateness_ms)
        if fired_late.any():
            out.append(self.emit(index[fired_late], state, key_column, values=merged[fired_late]))
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    # --- timers -------------------------------------------------------------------------------------

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        if isinstance(self.windows, EventTimeSessionWindows):
            return self.sessions_fired(timers, state)
        key_column = state.key_column
        stamps = timers["timestamp"].to_numpy()
        keys = timers[key_column].to_numpy(dtype=object)
        size, lateness = self.windows.size_ms, self.lateness_ms
        # a timer at end - 1 fires the window; at end - 1 + lateness it cleans it up
        fire_index = window_index(keys, stamps + 1 - size)
        if lateness:  # the window stays until its cleanup timer
            values = self.values(fire_index, state)
            self.clear(window_index(keys, stamps + 1 - size - lateness), state)
        else:  # read and removed in one lookup
            popped = state.pop_from_map(self.window_state, self.entries(fire_index)).to_numpy()
            values = popped.reshape(len(fire_index), len(self.aggregates))
        present = ~np.isnan(values).all(axis=1)  # a min or max of NaN only is still a window
        if not present.any():
            return pd.DataFrame()
        return self.emit(fire_index[present], state, key_column, values=values[present])

    def late(self, records: pd.DataFrame, late_rows: np.ndarray) -> list[pd.DataFrame]:
        """Records too late for any window of theirs: counted, and emitted with ``late`` true
        when the function was asked to."""
        if not len(late_rows):
            return []
        late_rows = np.unique(late_rows)
        self.late_records += len(late_rows)
        if not self.emit_late:
            return []
        late = records.iloc[late_rows].assign(late=True)
        if self.late_output is not None:
            late[SIDE_OUTPUT] = self.late_output
        return [late]

    def emit(
        self,
        index: pd.MultiIndex,
        state: KeyedState,
        key_column: str,
        ends: np.ndarray | None = None,
        values: np.ndarray | None = None,
    ) -> pd.DataFrame:
        """One row per (key, window start) of ``index``: its bounds and aggregates (``ends``:
        the windows' ends, for sessions; ``values``: the aggregates, when already read)."""
        starts = index.get_level_values(1).to_numpy()
        if ends is None:
            assert not isinstance(self.windows, EventTimeSessionWindows)
            ends = starts + self.windows.size_ms
        if values is None:
            values = self.values(index, state)
        out = pd.DataFrame(
            {
                key_column: index.get_level_values(0).to_numpy(dtype=object),
                "window_start": starts,
                "window_end": ends,
            }
        )
        for i, (name, (_, how)) in enumerate(self.aggregates.items()):
            out[name] = values[:, i].astype("int64") if how == "count" else values[:, i]
        return out

    def entries(self, index: pd.MultiIndex) -> pd.MultiIndex:
        """The window map's entries of the windows (key, start) of ``index``: each window's
        aggregates in order, built from its codes (no key is hashed again)."""
        width = len(self.aggregates)
        positions = np.arange(width, dtype=np.int64)
        starts = np.asarray(index.levels[1], dtype=np.int64)
        return pd.MultiIndex(
            levels=[index.levels[0], (starts[:, None] * width + positions).ravel()],
            codes=[
                np.repeat(index.codes[0], width),
                (np.asarray(index.codes[1], dtype=np.int64)[:, None] * width + positions).ravel(),
            ],
            names=["key", "user_key"],
            verify_integrity=False,
        )

    def values(self, index: pd.MultiIndex, state: KeyedState) -> np.ndarray:
        """The aggregates of the windows of ``index``, one row per window (NaN: no such
        window)."""
        found = state.map(self.window_state).reindex(self.entries(index)).to_numpy(dtype="float64")
        values: np.ndarray = found.reshape(len(index), len(self.aggregates))
        return values

    def clear(self, index: pd.MultiIndex, state: KeyedState) -> None:
        state.remove_from_map(self.window_state, self.entries(index))
        if SESSION_END in self.state:
            state.remove_from_map(SESSION_END, index)

    # --- session windows ----------------------------------------------------------------------------

    def process_sessions(
        self, records: pd.DataFrame, state: KeyedState, windows: EventTimeSessionWindows
    ) -> pd.DataFrame:
        """The round's records merged with their keys' open sessions: a new record opens a
        session or joins (and may bridge) those it touches; a merged session is kept under its
        new start, its timers moved to its new end."""
        stamps = event_times(records[self.timestamp_column])
        keys = records[state.key_column].to_numpy(dtype=object)
        old = open_sessions(state).assign(row=-1)
        new = pd.DataFrame(
            {
                "key": keys,
                "start": stamps,
                "end": stamps + windows.gap_ms,
                "row": np.arange(len(keys)),
            }
        )
        both = pd.concat([old, new], ignore_index=True)
        both["session"] = merged_sessions(both)
        touched = both.groupby("session")["row"].transform("max").to_numpy() >= 0
        both = both[touched]  # sessions without a new record stay as they are
        bounds = both.groupby("session", sort=False).agg(
            key=("key", "first"), start=("start", "min"), end=("end", "max")
        )
        watermark = state.current_watermark
        late = bounds.index[(bounds["end"] - 1 + self.lateness_ms <= watermark).to_numpy()]
        is_late = both["session"].isin(late).to_numpy()
        out = self.late(records, both["row"].to_numpy()[is_late & (both["row"] >= 0).to_numpy()])
        both, bounds = both[~is_late], bounds.drop(late)
        if not len(bounds):
            return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
        self.replace_sessions(records, state, both, bounds)
        passed = (bounds["end"] - 1 <= watermark).to_numpy()  # within the lateness: again now
        if passed.any():
            fired = bounds[passed]
            index = session_index(fired["key"], fired["start"])
            out.append(self.emit(index, state, state.key_column, fired["end"].to_numpy()))
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    def replace_sessions(
        self, records: pd.DataFrame, state: KeyedState, both: pd.DataFrame, bounds: pd.DataFrame
    ) -> None:
        """The sessions ``bounds`` in place of the open ones they merged (rows of ``both`` with
        ``row`` -1), their aggregates over those and the new records, their timers moved."""
        merged = both[both["row"] < 0]
        old_index = session_index(merged["key"], merged["start"])
        new_index = session_index(bounds["key"], bounds["start"])
        rows = both["row"].to_numpy()
        fresh = rows >= 0
        kept = self.values(old_index, state)
        totals = []
        for i, (column, how) in enumerate(self.aggregates.values()):
            values = np.empty(len(both), dtype="float64")
            values[~fresh] = kept[:, i]
            if column == "*" or how == "count":  # a count counts records, as pandas' size
                values[fresh] = 1.0
            else:
                values[fresh] = records[column].to_numpy(dtype="float64")[rows[fresh]]
            part = pd.Series(values).groupby(both["session"].to_numpy(), sort=False)
            totals.append(
                part.agg("sum" if how == "count" else how).reindex(bounds.index).to_numpy()
            )
        self.clear_one(self.window_state, self.entries(old_index), state)
        values = np.column_stack(totals).ravel()
        state.put_in_map(self.window_state, pd.Series(values, index=self.entries(new_index)))
        self.clear_one(SESSION_END, old_index, state)
        state.put_in_map(SESSION_END, pd.Series(bounds["end"].to_numpy(), index=new_index))
        self.move_timers(state, merged["key"], merged["end"], bounds)

    @staticmethod
    def clear_one(name: str, index: pd.MultiIndex, state: KeyedState) -> None:
        if len(index):
            state.remove_from_map(name, index)

    def move_timers(
        self, state: KeyedState, keys: pd.Series, old_ends: pd.Series, bounds: pd.DataFrame
    ) -> None:
        """The merged sessions' timers deleted, then the timers of every open session of those
        keys registered (the new ones among them): at its end - 1 (unless the watermark passed
        it) and, with allowed lateness, its cleanup."""
        old = pd.Series(old_ends.to_numpy() - 1, index=keys.to_numpy(dtype=object))
        if len(old):
            state.delete_event_time_timers(old)
            if self.lateness_ms:
                state.delete_event_time_timers(old + self.lateness_ms)
        # every open session of these keys keeps its timers: a deleted timer may have been
        # another session's too (timers are (key, time): with a lateness above the gap, one
        # session's cleanup can fall on another's end)
        sessions = open_sessions(state)
        sessions = sessions[sessions["key"].isin(set(bounds["key"].tolist()))]
        ends = pd.Series(
            sessions["end"].to_numpy() - 1, index=sessions["key"].to_numpy(dtype=object)
        )
        state.register_event_time_timers(ends[ends > state.current_watermark])
        if self.lateness_ms:
            state.register_event_time_timers(ends + self.lateness_ms)

    def sessions_fired(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        """A timer at a session's end - 1 emits it; at its end - 1 + the lateness (or at once,
        without lateness) its state goes."""
        sessions = open_sessions(state)
        fired = pd.DataFrame(
            {
                "key": timers[state.key_column].to_numpy(dtype=object),
                "timestamp": timers["timestamp"].to_numpy(dtype=np.int64),
            }
        ).merge(sessions, on="key")
        due = fired[(fired["end"] - 1 == fired["timestamp"]).to_numpy()]
        gone = fired[(fired["end"] - 1 + self.lateness_ms == fired["timestamp"]).to_numpy()]
        out = pd.DataFrame()
        if len(due):
            index = session_index(due["key"], due["start"])
            out = self.emit(index, state, state.key_column, due["end"].to_numpy())
        if len(gone):
            self.clear(session_index(gone["key"], gone["start"]), state)
        return out


def open_sessions(state: KeyedState) -> pd.DataFrame:
    """The open sessions of the keys ``state`` holds: key, start, end."""
    known = state.map(SESSION_END)
    return pd.DataFrame(
        {
            "key": known.index.get_level_values(0).to_numpy(dtype=object),
            "start": known.index.get_level_values(1).to_numpy(dtype=np.int64),
            "end": known.to_numpy(dtype=np.int64),
        }
    )


def merged_sessions(intervals: pd.DataFrame) -> np.ndarray:
    """A session number per interval (``key``, ``start``, ``end``): a key's intervals sorted by
    start share a session while each starts at or before the highest end before it (Flink's
    ``TimeWindow.intersects``: touching windows merge)."""
    order = np.lexsort((intervals["start"].to_numpy(), pd.factorize(intervals["key"])[0]))
    ordered = intervals.iloc[order]
    key_codes = pd.factorize(ordered["key"])[0]
    reach = pd.Series(ordered["end"].to_numpy()).groupby(key_codes).cummax()
    before = reach.groupby(key_codes).shift().to_numpy()
    opens = np.isnan(before) | (ordered["start"].to_numpy() > np.nan_to_num(before))
    session = np.empty(len(intervals), dtype=np.int64)
    session[order] = np.cumsum(opens)
    return session


def session_index(keys: pd.Series, starts: pd.Series) -> pd.MultiIndex:
    return window_index(keys.to_numpy(dtype=object), starts.to_numpy(dtype=np.int64))


def window_state_name(aggregates: Mapping[str, tuple[str, str]]) -> str:
    """The window map's state name, which spells out its aggregates (``window(n=*:count,
    total=amount:sum)``): a job restored with other aggregates, or the same in another order,
    declares another state and does not read values laid out for the old ones."""
    spelled = ",".join(f"{name}={column}:{how}" for name, (column, how) in aggregates.items())
    return f"{WINDOW}({spelled})"


def window_index(keys: np.ndarray, starts: np.ndarray) -> pd.MultiIndex:
    """(key, window start) pairs as an index."""
    return entry_index(np.asarray(keys, dtype=object), np.asarray(starts, dtype=np.int64))


def window_groups(keys: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, pd.MultiIndex]:
    """Each row's window (key, start) as a number, and the windows as an index in that order
    (first seen first): factorized codes, no groupby."""
    key_codes, key_levels = pd.factorize(keys)
    start_codes, start_levels = pd.factorize(starts)
    width = max(len(start_levels), 1)
    group, pairs = pd.factorize(key_codes.astype(np.int64) * width + start_codes)
    index = pd.MultiIndex(
        levels=[pd.Index(key_levels, dtype=object), pd.Index(start_levels, dtype=np.int64)],
        codes=[pairs // width, pairs % width],
        names=["key", "user_key"],
        sortorder=0,
        verify_integrity=False,
    )
    return group, index


def aggregate(
    how: str, group: np.ndarray, windows: int, column: pd.Series | None, rows: np.ndarray
) -> np.ndarray:
    """One aggregate per window of the rows ``rows`` of ``column`` (None: ``*``), ``group``
    naming each row's window, as pandas' groupby gives it (a count counts rows, a sum skips
    NaN, a min or max of NaN only is NaN)."""
    if how == "count":
        counted: np.ndarray = np.bincount(group, minlength=windows).astype(np.float64)
        return counted
    assert column is not None
    values = column.to_numpy(dtype=np.float64, na_value=np.nan)[rows]
    if how == "sum":
        summed: np.ndarray = np.bincount(
            group, weights=np.where(np.isnan(values), 0.0, values), minlength=windows
        )
        return summed
    picked = np.full(windows, np.nan)
    (np.fmin if how == "min" else np.fmax).at(picked, group, values)
    return picked


def combine(hows: list[str], known: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Windows' kept aggregates (NaN: none yet) with a round's part of them: a column per
    aggregate."""
    merged = np.empty_like(part)
    for i, how in enumerate(hows):
        if how in ("count", "sum"):
            merged[:, i] = np.where(np.isnan(known[:, i]), 0.0, known[:, i]) + part[:, i]
        else:
            pick = np.fmin if how == "min" else np.fmax
            merged[:, i] = pick(known[:, i], part[:, i])
    return merged
