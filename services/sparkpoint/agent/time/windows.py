"""Event-time windows on timers (Flink's ``TumblingEventTimeWindows``,
``SlidingEventTimeWindows``, allowed lateness and late data), as a keyed function a job uses
whole or a subclass extends::

    job = Job(..., key="account",
              function=WindowAggregate(TumblingEventTimeWindows.of("10s"),
                                       {"payments": ("amount", "count"),
                                        "total": ("amount", "sum")},
                                       timestamp_column="ts",
                                       allowed_lateness="5s"))

A record goes to every window it falls in (one when tumbling, ``size / slide`` when sliding).
Each window's aggregates are kept per key as map state (key, window start) and emitted once the
watermark passes the window's end: one row per key and window, with the key column,
``window_start``, ``window_end`` (exclusive) and the aggregates. With allowed lateness, a
record that arrives after its window fired but within the lateness updates the window and emits
it again at once (Flink's default trigger fires again for each late element); the window's
state goes when the watermark passes its end plus the lateness. A record later than that is
late: dropped and counted (``WindowAggregate.late_records`` of the task, and a row with
``late`` true when ``emit_late`` is on, Flink's ``sideOutputLateData``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from sparkpoint.agent.job import KeyedFunction, KeyedState, MapState, StateDescriptor
from sparkpoint.agent.time.strategy import event_times
from sparkpoint.common.options import parse_duration

AGGREGATES = ("count", "sum", "min", "max")
"""What a window keeps per aggregate; ``mean`` is not kept (a sum and a count give it)."""


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


Windows = TumblingEventTimeWindows | SlidingEventTimeWindows


def assign(windows: Windows, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    ) -> None:
        for name, (_, how) in aggregates.items():
            if how not in AGGREGATES:
                raise ValueError(f"aggregate {name!r}: {how!r} is not one of {AGGREGATES}")
        self.windows = windows
        self.aggregates = dict(aggregates)
        self.timestamp_column = timestamp_column
        self.lateness_ms = parse_duration(allowed_lateness)
        self.emit_late = emit_late
        self.late_records = 0
        # one map state per aggregate, (key, window start) -> value: declared per instance,
        # as its aggregates are (KeyedFunction.state is read from the function, not its class)
        self.state = {  # type: ignore[misc]
            f"window:{n}": MapState("int64", "float64") for n in self.aggregates
        }

    # --- records ------------------------------------------------------------------------------------

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        key_column = state.key_column
        stamps = event_times(records[self.timestamp_column])
        rows, starts = assign(self.windows, stamps)
        ends = starts + self.windows.size_ms
        watermark = state.current_watermark
        late = ends - 1 + self.lateness_ms <= watermark
        out: list[pd.DataFrame] = []
        if late.any():
            late_rows = np.unique(rows[late])
            self.late_records += len(late_rows)
            if self.emit_late:
                out.append(records.iloc[late_rows].assign(late=True))
        rows, starts, ends = rows[~late], starts[~late], ends[~late]
        if not len(rows):
            return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
        keys = records[key_column].to_numpy(dtype=object)[rows]
        frame = pd.DataFrame({"key": keys, "user_key": starts})
        for name, (column, _) in self.aggregates.items():
            frame[name] = records[column].to_numpy()[rows] if column != "*" else 1
        grouped = frame.groupby(["key", "user_key"], sort=False)
        index: pd.MultiIndex | None = None
        for name, (_, how) in self.aggregates.items():
            part = grouped[name].agg("size" if how == "count" else how).astype("float64")
            index = part.index
            known = state.map(f"window:{name}").reindex(part.index)
            merged = combine(how, known, part)
            state.put_in_map(f"window:{name}", merged)
        assert index is not None
        window_ends = index.get_level_values(1).to_numpy() + self.windows.size_ms
        timers = pd.Series(window_ends - 1, index=index.get_level_values(0))
        fired_late = window_ends - 1 <= watermark  # within the lateness: emitted again now
        state.register_event_time_timers(timers[~fired_late])  # a fired window's timer is gone
        if self.lateness_ms:
            state.register_event_time_timers(timers + self.lateness_ms)
        if fired_late.any():
            out.append(self.emit(index[fired_late], state, key_column))
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    # --- timers -------------------------------------------------------------------------------------

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        key_column = state.key_column
        stamps = timers["timestamp"].to_numpy()
        keys = timers[key_column].to_numpy(dtype=object)
        size, lateness = self.windows.size_ms, self.lateness_ms
        # a timer at end - 1 fires the window; at end - 1 + lateness it cleans it up
        fire_index = pd.MultiIndex.from_arrays([keys, stamps + 1 - size], names=["key", "user_key"])
        first = next(iter(self.aggregates))
        present = state.map(f"window:{first}").reindex(fire_index).notna().to_numpy()
        out = pd.DataFrame()
        if present.any():
            out = self.emit(fire_index[present], state, key_column)
        if lateness:
            clean = pd.MultiIndex.from_arrays(
                [keys, stamps + 1 - size - lateness], names=["key", "user_key"]
            )
            self.clear(clean, state)
        else:
            self.clear(fire_index, state)
        return out

    def emit(self, index: pd.MultiIndex, state: KeyedState, key_column: str) -> pd.DataFrame:
        starts = index.get_level_values(1).to_numpy()
        out = pd.DataFrame(
            {
                key_column: index.get_level_values(0).to_numpy(dtype=object),
                "window_start": starts,
                "window_end": starts + self.windows.size_ms,
            }
        )
        for name, (_, how) in self.aggregates.items():
            values = state.map(f"window:{name}").reindex(index).to_numpy()
            out[name] = values.astype("int64") if how == "count" else values
        return out

    def clear(self, index: pd.MultiIndex, state: KeyedState) -> None:
        for name in self.aggregates:
            state.remove_from_map(f"window:{name}", index)


def combine(how: str, known: pd.Series, part: pd.Series) -> pd.Series:
    """A window's kept aggregate with a round's part of it."""
    if how in ("count", "sum"):
        return known.fillna(0.0) + part
    pick = np.fmin if how == "min" else np.fmax
    return pd.Series(pick(known.to_numpy(), part.to_numpy()), index=part.index)
