"""Spark's own stateful processors, unchanged, as a job's keyed stage.

A `pyspark.sql.streaming.stateful_processor.StatefulProcessor` written for Spark's
``transformWithStateInPandas`` runs here as it is::

    job = Job(..., key="user",
              function=SparkProcessor(MyProcessor(), time_mode="EventTime",
                                      event_time_column="ts"))

Its handle gives what Spark's gives: value, list and map state (with ``ttlDurationMs``), timers
(``registerTimer``, ``deleteTimer``, ``listTimers``) and ``deleteIfExists``; ``handleInputRows``
gets each key's rows of a round (``key`` a tuple, as Spark passes it) with the round's
`TimerValues`, ``handleExpiredTimer`` each fired timer of a key in timestamp order. The state
lives in sparkpoint's key groups (each variable a declared state holding pickled tuples), so a
processor gains what Spark's state store does not have: savepoints, restores with another
parallelism, unaligned checkpoints.

How it maps, per round and subtask: the state of the round's keys is read once into Python
values, the processor is called key by key (Spark calls it key by key too), and what it changed
is written back a state at a time. ``init`` is called as Spark calls it, at the start of each
task (a round's part), and ``close`` at its end.

What differs from Spark:

- ``time_mode="EventTime"`` takes the watermark from the job's source (its `WatermarkStrategy`),
  not from an upstream ``withWatermark``; rows at or below the watermark before the round are
  late and dropped before the processor sees them, as Spark drops them (counted in
  ``late_rows``). The watermark Spark reports before its first is 0; here it is -1 until the
  source has one.
- TTL follows Spark's meaning (a write resets an entry's expiry; an expired entry is never
  returned), in processing time.
- ``deleteIfExists`` clears the variable of the key being processed: a keyed function here sees
  the keys of its round only, where Spark purges the variable for every key.
- ``initial_state=`` (rows with the job's key column) is handed to ``handleInitialState`` key by
  key in the first round of a fresh start, as Spark hands ``initialState`` to the first batch;
  a restore does not hand it again (the state it made is in every checkpoint: none completes
  before it was applied). The rows travel inside the function to every task.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)

from sparkpoint.agent import job
from sparkpoint.agent.job import KeyedFunction, KeyedState
from sparkpoint.agent.time.strategy import MIN_WATERMARK, event_times
from sparkpoint.agent.time.ttl import StateTtlConfig

TIME_MODES = ("none", "processingtime", "eventtime")


def _dump(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _load(data: Any) -> Any:
    return pickle.loads(data)


def _ttl(ttl_ms: int | None) -> StateTtlConfig | None:
    return StateTtlConfig.new_builder(int(ttl_ms)) if ttl_ms else None


# --- the round's state, as Python values -----------------------------------------------------------


class RoundState:
    """The state of one round's keys, read from the `KeyedState` once, changed key by key by
    the processor, and written back (`flush`) a state at a time."""

    def __init__(self, keyed: KeyedState, kinds: dict[str, str]) -> None:
        self.keyed = keyed
        self.kinds = kinds
        self.values: dict[str, dict[Any, Any]] = {}
        self.dirty: dict[str, set[Any]] = {name: set() for name in kinds}
        self.key: Any = None
        for name, kind in kinds.items():
            self.values[name] = self._read(name, kind)
        self.read = {
            name: {k: dict(v) for k, v in self.values[name].items()}
            for name, kind in kinds.items()
            if kind == "map"
        }
        """Each map as read: what `_write_map` compares with."""

    def _read(self, name: str, kind: str) -> dict[Any, Any]:
        found: dict[Any, Any] = {}
        if kind == "value":
            series = self.keyed.value(name)
            for key, data in zip(series.index, series.tolist(), strict=True):
                found[key] = _load(data)
        elif kind == "list":
            series = self.keyed.list(name)
            for key, data in zip(series.index, series.tolist(), strict=True):
                found.setdefault(key, []).append(_load(data))
        else:
            series = self.keyed.map(name)
            for (key, user_key), data in zip(series.index, series.tolist(), strict=True):
                found.setdefault(key, {})[user_key] = _load(data)
        return found

    def get(self, name: str) -> Any:
        return self.values[name].get(self.key)

    def put(self, name: str, value: Any) -> None:
        """The current key's value of ``name`` (None: none)."""
        if value is None:
            self.values[name].pop(self.key, None)
        else:
            self.values[name][self.key] = value
        self.dirty[name].add(self.key)

    def flush(self) -> None:
        for name, keys in self.dirty.items():
            if keys:
                self._write(name, self.kinds[name], keys)
            keys.clear()

    def _write(self, name: str, kind: str, keys: set[Any]) -> None:
        held = self.values[name]
        gone = [k for k in keys if k not in held]
        kept = [k for k in keys if k in held]
        if kind == "value":
            if gone:
                self.keyed.clear_value(name, gone)
            if kept:
                data = [_dump(held[k]) for k in kept]
                self.keyed.update_value(name, pd.Series(data, index=kept, dtype=object))
        elif kind == "list":  # a key's list is written whole
            if gone:
                self.keyed.clear_list(name, gone)
            if kept:
                index = pd.Index([k for k in kept for _ in held[k]], dtype=object)
                data = [_dump(v) for k in kept for v in held[k]]
                self.keyed.set_list(name, pd.Series(data, index=index, dtype=object))
        else:  # a map's entries one by one: an entry not changed keeps its TTL
            self._write_map(name, keys)

    def _write_map(self, name: str, keys: set[Any]) -> None:
        held, read = self.values[name], self.read[name]
        removed = [(k, uk) for k in keys for uk in read.get(k, {}) if uk not in held.get(k, {})]
        if removed:
            index = pd.MultiIndex.from_tuples(removed, names=["key", "user_key"])
            self.keyed.remove_from_map(name, index)
        changed = [
            (k, uk)
            for k in keys
            for uk, v in held.get(k, {}).items()
            if uk not in read.get(k, {}) or read[k][uk] != v
        ]
        if changed:
            index = pd.MultiIndex.from_tuples(changed, names=["key", "user_key"])
            data = [_dump(held[k][uk]) for k, uk in changed]
            self.keyed.put_in_map(name, pd.Series(data, index=index, dtype=object))


# --- Spark's state variables and handle over it -------------------------------------------------------


class _Value(ValueState):
    def __init__(self, handle: ProcessorHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def exists(self) -> bool:
        return self.handle.round.get(self.name) is not None

    def get(self) -> tuple[Any, ...] | None:
        value: tuple[Any, ...] | None = self.handle.round.get(self.name)
        return value

    def update(self, newValue: tuple[Any, ...]) -> None:
        self.handle.round.put(self.name, tuple(newValue))

    def clear(self) -> None:
        self.handle.round.put(self.name, None)


class _List(ListState):
    def __init__(self, handle: ProcessorHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def _items(self) -> list[tuple[Any, ...]]:
        return list(self.handle.round.get(self.name) or [])

    def exists(self) -> bool:
        return bool(self._items())

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._items())

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        self.handle.round.put(self.name, [tuple(v) for v in newState] or None)

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        self.handle.round.put(self.name, [*self._items(), tuple(newState)])

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        self.handle.round.put(self.name, [*self._items(), *(tuple(v) for v in newState)] or None)

    def clear(self) -> None:
        self.handle.round.put(self.name, None)


class _Map(MapState):
    def __init__(self, handle: ProcessorHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def _entries(self) -> dict[bytes, tuple[Any, ...]]:
        return dict(self.handle.round.get(self.name) or {})

    def exists(self) -> bool:
        return bool(self._entries())

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return self._entries().get(_dump(tuple(key)))

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        return _dump(tuple(key)) in self._entries()

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        entries = self._entries()
        entries[_dump(tuple(key))] = tuple(value)
        self.handle.round.put(self.name, entries)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter([(_load(k), v) for k, v in self._entries().items()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter([_load(k) for k in self._entries()])

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self._entries().values()))

    def removeKey(self, key: tuple[Any, ...]) -> None:
        entries = self._entries()
        entries.pop(_dump(tuple(key)), None)
        self.handle.round.put(self.name, entries or None)

    def clear(self) -> None:
        self.handle.round.put(self.name, None)


class ProcessorHandle(StatefulProcessorHandle):
    """Spark's handle, over the state of the round a task is in (`RoundState`) and the current
    key's timers."""

    def __init__(self, time_mode: str) -> None:
        self.time_mode = time_mode
        self.declared: dict[str, job.StateDescriptor] = {}
        self.kinds: dict[str, str] = {}
        self._round: RoundState | None = None
        self.timers: dict[Any, set[int]] = {}
        self.registered: list[tuple[Any, int]] = []
        self.deleted: list[tuple[Any, int]] = []

    @property
    def round(self) -> RoundState:
        if self._round is None:
            raise RuntimeError("state is read and written inside handleInputRows or a timer")
        return self._round

    def _declare(self, name: str, kind: str, descriptor: job.StateDescriptor) -> None:
        if self.kinds.get(name, kind) != kind:
            raise ValueError(f"state {name!r} is declared as a {self.kinds[name]} state already")
        self.kinds[name] = kind
        self.declared[name] = descriptor

    def getValueState(
        self, stateName: str, schema: Any, ttlDurationMs: int | None = None
    ) -> ValueState:
        self._declare(stateName, "value", job.ValueState("object", ttl=_ttl(ttlDurationMs)))
        return _Value(self, stateName)

    def getListState(
        self, stateName: str, schema: Any, ttlDurationMs: int | None = None
    ) -> ListState:
        self._declare(stateName, "list", job.ListState("object", ttl=_ttl(ttlDurationMs)))
        return _List(self, stateName)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> MapState:
        descriptor = job.MapState("object", "object", ttl=_ttl(ttlDurationMs))
        self._declare(stateName, "map", descriptor)
        return _Map(self, stateName)

    def _timed(self, operation: str) -> None:
        if self.time_mode == "none":
            raise ValueError(f"{operation} needs time_mode ProcessingTime or EventTime (None)")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._timed("registerTimer")
        key = self.round.key
        self.timers.setdefault(key, set()).add(int(expiryTimestampMs))
        self.registered.append((key, int(expiryTimestampMs)))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timed("deleteTimer")
        key = self.round.key
        self.timers.get(key, set()).discard(int(expiryTimestampMs))
        self.deleted.append((key, int(expiryTimestampMs)))

    def listTimers(self) -> Iterator[int]:
        self._timed("listTimers")
        return iter(sorted(self.timers.get(self.round.key, set())))

    def deleteIfExists(self, stateName: str) -> None:
        """Clears ``stateName`` for the current key (Spark purges it for every key)."""
        if stateName in self.kinds:
            self.round.put(stateName, None)


class SparkProcessor(KeyedFunction):
    """A `StatefulProcessor` as the keyed function (see the module's docstring)."""

    def __init__(
        self,
        processor: StatefulProcessor,
        time_mode: str = "None",
        event_time_column: str | None = None,
        initial_state: pd.DataFrame | None = None,
    ) -> None:
        """``initial_state``: rows with the job's key column, each key's rows handed to the
        processor's ``handleInitialState`` in the first round of a fresh start (Spark's
        ``initialState``, grouped by the same key)."""
        mode = time_mode.lower()
        if mode not in TIME_MODES:
            raise ValueError(f"time_mode {time_mode!r}: one of None, ProcessingTime, EventTime")
        if mode == "eventtime" and event_time_column is None:
            raise ValueError("time_mode EventTime needs the event_time_column of the records")
        self.processor = processor
        self.time_mode = mode
        self.event_time_column = event_time_column
        self._initial_rows = initial_state
        self.late_rows = 0
        handle = ProcessorHandle(mode)
        processor.init(handle)  # the state variables it declares
        self.kinds = dict(handle.kinds)
        self.state = dict(handle.declared)  # type: ignore[misc]

    def initial_state(self) -> pd.DataFrame | None:
        return self._initial_rows

    # --- a task's part ----------------------------------------------------------------------------

    def _open(self, state: KeyedState) -> ProcessorHandle:
        handle = ProcessorHandle(self.time_mode)
        self.processor.init(handle)
        handle._round = RoundState(state, self.kinds)
        if self.time_mode != "none":
            timers = self._timers(state)
            for key, stamp in zip(timers.index, timers.tolist(), strict=True):
                handle.timers.setdefault(key, set()).add(int(stamp))
        return handle

    def _timers(self, state: KeyedState) -> pd.Series:
        if self.time_mode == "eventtime":
            return state.event_time_timers()
        return state.processing_time_timers()

    def _close(self, handle: ProcessorHandle, state: KeyedState) -> None:
        """The round's state written back, and the timers the processor registered or deleted
        as it left them."""
        handle.round.flush()
        touched = set(handle.registered) | set(handle.deleted)
        if touched:
            register, delete = self._timer_calls(state)
            on = [(k, s) for k, s in touched if s in handle.timers.get(k, ())]
            off = [(k, s) for k, s in touched if s not in handle.timers.get(k, ())]
            if off:
                delete(pd.Series([s for _, s in off], index=[k for k, _ in off], dtype="int64"))
            if on:
                register(pd.Series([s for _, s in on], index=[k for k, _ in on], dtype="int64"))
        self.processor.close()

    def _timer_calls(self, state: KeyedState) -> tuple[Any, Any]:
        if self.time_mode == "eventtime":
            return state.register_event_time_timers, state.delete_event_time_timers
        return state.register_processing_time_timers, state.delete_processing_time_timers

    def _timer_values(self, state: KeyedState, watermark: int) -> TimerValues:
        if self.time_mode == "none":
            return TimerValues(-1, -1)
        processing = int(state.current_processing_time)
        if self.time_mode == "processingtime":
            return TimerValues(processing, -1)
        return TimerValues(processing, -1 if watermark == MIN_WATERMARK else watermark)

    @staticmethod
    def _collect(result: Any) -> list[pd.DataFrame]:
        return [frame for frame in (result or []) if frame is not None and len(frame)]

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        watermark = state.current_watermark
        if self.time_mode == "eventtime" and watermark != MIN_WATERMARK:
            assert self.event_time_column is not None
            on_time = event_times(records[self.event_time_column]) > watermark
            self.late_rows += int((~on_time).sum())
            records = records[on_time]
        handle = self._open(state)
        values = self._timer_values(state, watermark)
        out: list[pd.DataFrame] = []
        try:
            for key, rows in records.groupby(state.key_column, sort=False):
                handle.round.key = key
                rows = rows.reset_index(drop=True)
                out += self._collect(self.processor.handleInputRows((key,), iter([rows]), values))
        finally:
            self._close(handle, state)
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    def on_initial_state(self, rows: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        """Each key's initial rows to ``handleInitialState`` (which emits nothing, as in
        Spark), before the round's records."""
        handle = self._open(state)
        values = self._timer_values(state, state.current_watermark)
        try:
            for key, part in rows.groupby(state.key_column, sort=False):
                handle.round.key = key
                self.processor.handleInitialState((key,), part.reset_index(drop=True), values)
        finally:
            self._close(handle, state)
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        handle = self._open(state)
        values = self._timer_values(state, state.current_watermark)
        out: list[pd.DataFrame] = []
        try:
            keys = timers[state.key_column].tolist()
            for key, stamp in zip(keys, timers["timestamp"].tolist(), strict=True):
                handle.round.key = key
                handle.timers.get(key, set()).discard(int(stamp))  # a fired timer is gone
                info = ExpiredTimerInfo(int(stamp))
                out += self._collect(self.processor.handleExpiredTimer((key,), values, info))
        finally:
            self._close(handle, state)
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
