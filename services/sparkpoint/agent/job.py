"""The job API: a job is declared in Python and handed to ``sparkpoint agent``.

A job is ``source -> stage 1 -> keyed stage 2 -> sink`` (DESIGN.md section 4)::

    job = Job(
        name="payments",
        source=KafkaSource(["payments"]),
        map=lambda frame: frame[frame["amount"] > 0],   # stage 1: vectorized map/filter
        key="account",                                   # key extraction: a column
        function=RunningTotals(),                        # stage 2: keyed, stateful, vectorized
        sink=KafkaSink("payment-totals"),
        parallelism=2,
        settings={"execution.checkpointing.interval": "5s"},
    )

Stage 1 runs on every fetched batch as a pandas DataFrame. Stage 2 calls the keyed function once
per subtask and round with the round's records (many keys; each key's in source order) and a
`KeyedState` holding the state of their keys, typed by the function's `state` declarations
(value, list and map state); the state is kept per key group. Everything is columnar: a
function never sees one record at a time.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

# sources and sinks (connectors.py), named here too: the job API is this module
from sparkpoint.agent.connectors import (
    DEFAULT_MAX_DURATION_PER_TRIGGER as DEFAULT_MAX_DURATION_PER_TRIGGER,
)
from sparkpoint.agent.connectors import SIDE_OUTPUT as SIDE_OUTPUT
from sparkpoint.agent.connectors import DeliveryGuarantee as DeliveryGuarantee
from sparkpoint.agent.connectors import FileSink as FileSink
from sparkpoint.agent.connectors import FileSource as FileSource
from sparkpoint.agent.connectors import KafkaSink as KafkaSink
from sparkpoint.agent.connectors import KafkaSource as KafkaSource
from sparkpoint.agent.connectors import Sink as Sink
from sparkpoint.agent.connectors import Source as Source
from sparkpoint.agent.job_spec import parse_job_spec
from sparkpoint.agent.time.strategy import MIN_WATERMARK
from sparkpoint.agent.time.ttl import StateTtlConfig, ttl_state_name
from sparkpoint.common.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from sparkpoint.common.limits import JOB_ID_PATTERN

# --- state declarations ----------------------------------------------------------------------


@dataclass(frozen=True)
class ValueState:
    """One value per key. In a function: a Series indexed by key."""

    dtype: str = "object"
    ttl: StateTtlConfig | None = None
    """The entries' time-to-live (`StateTtlConfig`); None: they live until deleted."""

    def enable_time_to_live(self, ttl: StateTtlConfig) -> ValueState:
        return replace(self, ttl=ttl)


@dataclass(frozen=True)
class ListState:
    """An ordered list of values per key. In a function: a Series indexed by key (repeated),
    in list order. A TTL applies to each element, as in Flink."""

    dtype: str = "object"
    ttl: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl: StateTtlConfig) -> ListState:
        return replace(self, ttl=ttl)


@dataclass(frozen=True)
class MapState:
    """A map per key. In a function: a Series indexed by (key, user key). A TTL applies to each
    entry, as in Flink."""

    key_dtype: str = "object"
    dtype: str = "object"
    ttl: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl: StateTtlConfig) -> MapState:
        return replace(self, ttl=ttl)


StateDescriptor = ValueState | ListState | MapState


class KeyedState:
    """The state of the keys a keyed function was given, while it runs: each declared state as a pandas
    Series, read and replaced a whole column at a time."""

    def __init__(
        self,
        declared: Mapping[str, StateDescriptor],
        frames: Mapping[str, pd.Series],
        current_watermark: int = MIN_WATERMARK,
        current_processing_time: int = 0,
        key_column: str = "key",
    ):
        self.declared = with_ttl_companions(declared)
        self.current_watermark = current_watermark
        self.current_processing_time = current_processing_time
        self.key_column = key_column
        """The job's key column (the records' and a fired timer frame's)."""
        """The round's processing time (ms since the epoch, the driver's clock when it planned
        the round; Flink's ``currentProcessingTime()``): what processing-time timers and state
        TTLs compare to."""
        """The subtask's event-time watermark before this round's records (ms; Flink's
        ``currentWatermark()``, `MIN_WATERMARK` before the first): records at or below it
        arrived late."""
        self.ttls = {name: d.ttl for name, d in self.declared.items() if d.ttl is not None}
        """The states with a time-to-live, and theirs."""
        self._series: dict[str, pd.Series] = {}
        for name, descriptor in self.declared.items():
            self._series[name] = frames.get(name, empty_series(descriptor))
        self.changed: set[str] = set()
        for name in self.ttls:
            self._series[ttl_state_name(name)] = self._stamps_of(
                name, self._series[name], self._series[ttl_state_name(name)]
            )

    def _check(self, name: str, kind: type) -> StateDescriptor:
        descriptor = self.declared.get(name)
        if descriptor is None:
            raise KeyError(f"state {name!r} is not declared (declared: {sorted(self.declared)})")
        if not isinstance(descriptor, kind):
            raise TypeError(
                f"state {name!r} is a {type(descriptor).__name__}, not a {kind.__name__}"
            )
        return descriptor

    def _read(self, name: str, kind: type) -> pd.Series:
        """A state as the function sees it: without its expired entries (they are removed, as
        Flink's TTL state clears an expired entry it reads), and refreshed when read if its
        TTL says so."""
        self._check(name, kind)
        ttl = self.ttls.get(name)
        if ttl is not None and len(self._series[name]):
            stamps_name = ttl_state_name(name)
            if not ttl.returns_expired:
                stamps = self._series[stamps_name].to_numpy()
                live = stamps + ttl.ttl_ms > self.current_processing_time
                if not live.all():
                    self._set(name, self._series[name][live])
                    self._follow(name, kept=live)
            if ttl.refreshed_on_read and len(self._series[name]):
                self._set(stamps_name, self._now(self._series[name].index))
        return self._series[name]

    def _replace(self, name: str, kind: type, values: pd.Series) -> None:
        """Entries whose index is in ``values``' index are replaced by ``values``."""
        descriptor = self._check(name, kind)
        current = self._series[name]
        kept = ~current.index.isin(values.index)
        self._set(name, concat_entries([current[kept], values.astype(descriptor.dtype)]))
        self._follow(name, kept=kept, added=values.index)

    def _remove(self, name: str, kind: type, index: pd.Index | list[Any]) -> None:
        self._check(name, kind)
        current = self._series[name]
        kept = ~current.index.isin(index)
        self._set(name, current[kept])
        self._follow(name, kept=kept)

    def _follow(
        self, name: str, kept: np.ndarray | None = None, added: pd.Index | None = None
    ) -> None:
        """``name``'s TTL timestamps after the change just made to it, entry for entry: those
        of the entries ``kept`` (a mask over the entries before; None: all), then ``added``
        entries, written now. Nothing for a state without a TTL."""
        if name not in self.ttls:
            return
        stamps_name = ttl_state_name(name)
        stamps = self._series[stamps_name]
        if kept is not None:
            stamps = stamps[kept]
        if added is not None:
            stamps = pd.concat([stamps, self._now(added)])
        self._set(stamps_name, stamps)

    def _now(self, index: pd.Index) -> pd.Series:
        """Timestamps of now for the entries of ``index``."""
        return pd.Series(self.current_processing_time, index=index, dtype="int64")

    def _stamps_of(self, name: str, series: pd.Series, stamps: pd.Series) -> pd.Series:
        """``stamps`` (as read from the store) in ``series``' order, entry for entry. A list's
        elements keep their order within a key, so they line up once the keys do; an entry
        without a timestamp (a state declared with a TTL after it was written) counts from
        now."""
        if isinstance(self.declared[name], ListState):
            if len(stamps) == len(series) and stamps.index.equals(series.index):
                return stamps
            _, uniques = pd.factorize(pd.Index(series.index, dtype=object))
            at = pd.Index(uniques).get_indexer(pd.Index(stamps.index, dtype=object))
            ordered = stamps.iloc[np.argsort(np.where(at < 0, len(uniques), at), kind="stable")]
            if len(ordered) == len(series) and ordered.index.equals(series.index):
                return ordered
            self.changed.add(ttl_state_name(name))
            return self._now(series.index)
        aligned = stamps.reindex(series.index)
        if aligned.isna().any():
            self.changed.add(ttl_state_name(name))
            aligned = aligned.fillna(self.current_processing_time)
        return aligned.astype("int64")

    # value state
    def value(self, name: str) -> pd.Series:
        return self._read(name, ValueState)

    def update_value(self, name: str, values: pd.Series) -> None:
        """Sets the value of every key in ``values``' index."""
        self._replace(name, ValueState, values)

    def clear_value(self, name: str, keys: pd.Index | list[Any]) -> None:
        self._remove(name, ValueState, keys)

    # list state
    def list(self, name: str) -> pd.Series:
        return self._read(name, ListState)

    def add_to_list(self, name: str, values: pd.Series) -> None:
        """Appends ``values`` (indexed by key, in order) to the lists of their keys."""
        descriptor = self._check(name, ListState)
        self._set(name, pd.concat([self._series[name], values.astype(descriptor.dtype)]))
        self._follow(name, added=values.index)

    def set_list(self, name: str, values: pd.Series) -> None:
        """Replaces the lists of the keys in ``values``' index."""
        self._replace(name, ListState, values)

    def clear_list(self, name: str, keys: pd.Index | Sequence[Any]) -> None:
        """Empties the lists of ``keys``."""
        self._remove(name, ListState, keys)

    # map state
    def map(self, name: str) -> pd.Series:
        return self._read(name, MapState)

    def put_in_map(self, name: str, values: pd.Series) -> None:
        """Puts entries indexed by (key, user key); existing entries with those indexes go."""
        self._replace(name, MapState, values)

    def remove_from_map(self, name: str, index: pd.MultiIndex) -> None:
        self._remove(name, MapState, index)

    def pop_from_map(self, name: str, index: pd.MultiIndex) -> pd.Series:
        """The values of the entries ``index`` names (NaN where there is none, as
        ``map(name).reindex(index)``), which are then removed: one lookup for a read and a
        removal (Python's ``dict.pop``)."""
        current = self._read(name, MapState)
        at = current.index.get_indexer(index)
        found = at >= 0
        values = pd.Series(np.nan, index=index, dtype="float64")
        if found.any():
            values = current.iloc[np.where(found, at, 0)].set_axis(index).where(found)
            kept = np.ones(len(current), dtype=bool)
            kept[at[found]] = False
            self._set(name, current[kept])
            self._follow(name, kept=kept)
        return values

    # timers (kept as keyed state, per key group)
    def event_time_timers(self) -> pd.Series:
        """The pending event-time timers of the keys given: timestamps (ms) indexed by key, a
        key repeated for each of its timers."""
        return self._timer_series(TIMERS)

    def processing_time_timers(self) -> pd.Series:
        """The pending processing-time timers of the keys given, as `event_time_timers`."""
        return self._timer_series(PROCESSING_TIMERS)

    def register_processing_time_timers(self, timers: pd.Series) -> None:
        """Registers processing-time timers: timestamps (ms since the epoch) indexed by key.
        One fires in the first round planned at or after its time (Flink's
        ``registerProcessingTimeTimer``), also when no record arrives."""
        index = self._timer_index(timers, PROCESSING_TIMERS)
        self._replace(PROCESSING_TIMERS, MapState, pd.Series(True, index=index, dtype="bool"))

    def delete_processing_time_timers(self, timers: pd.Series) -> None:
        self._remove(PROCESSING_TIMERS, MapState, self._timer_index(timers, PROCESSING_TIMERS))

    def _timer_series(self, name: str) -> pd.Series:
        timers = self._timers(name)
        return pd.Series(
            timers.index.get_level_values(1).to_numpy(dtype="int64"),
            index=pd.Index(timers.index.get_level_values(0), name="key"),
            name="timestamp",
            dtype="int64",
        )

    def register_event_time_timers(self, timers: pd.Series) -> None:
        """Registers a timer per entry: timestamps (ms) indexed by key. It fires once the
        watermark reaches it (`KeyedFunction.on_timer`); a timer registered twice fires once."""
        index = self._timer_index(timers, TIMERS)
        self._replace(TIMERS, MapState, pd.Series(True, index=index, dtype="bool"))

    def delete_event_time_timers(self, timers: pd.Series) -> None:
        """Deletes the timers given (timestamps indexed by key); unknown ones are ignored."""
        self._remove(TIMERS, MapState, self._timer_index(timers, TIMERS))

    def pop_due_timers(self, name: str, until: int) -> pd.Series:
        """Stage 2's firing: the pending timers of state ``name`` (`TIMERS` or
        `PROCESSING_TIMERS`) at or below ``until``, as `event_time_timers` gives them, which
        are then deleted."""
        pending = self._timer_series(name)
        due = (pending <= until).to_numpy()
        if due.any():
            self._set(name, self._timers(name)[~due])
        return pending[due]

    def _timers(self, name: str) -> pd.Series:
        if name not in self.declared:
            raise TypeError("timers need a keyed function that defines on_timer")
        return self._series[name]

    def _timer_index(self, timers: pd.Series, name: str) -> pd.MultiIndex:
        self._timers(name)
        stamps = pd.to_numeric(timers, downcast=None).to_numpy().astype("int64")
        return entry_index(np.asarray(timers.index, dtype=object), stamps)

    def _set(self, name: str, series: pd.Series) -> None:
        series.name = name
        self._series[name] = series
        self.changed.add(name)

    def add_keys(self, frames: Mapping[str, pd.Series]) -> None:
        """More keys' state (their state as read, for keys this state does not hold yet)."""
        frames = dict(frames)
        for name in self.ttls:
            if name in frames:
                stamps_name = ttl_state_name(name)
                stamps = frames.get(stamps_name, empty_series(self.declared[stamps_name]))
                frames[stamps_name] = self._stamps_of(name, frames[name], stamps)
        for name, series in frames.items():
            if len(series):
                self._series[name] = concat_entries([self._series[name], series])

    def frames(self) -> dict[str, pd.Series]:
        return dict(self._series)


def entry_index(keys: np.ndarray, user_keys: np.ndarray) -> pd.MultiIndex:
    """(key, user key) pairs as a map state's index. Its levels are factorized, not sorted
    (``MultiIndex.from_arrays`` sorts them, and sorting a round's keys cost several times the
    rest of a lookup), and it says it is not sorted (``sortorder=0``): a range ``.loc`` on it
    raises pandas' UnsortedIndexError rather than slicing by the order of its levels. A state
    series that a put concatenated has whatever levels pandas' concatenation gives it (as a
    ``groupby(sort=False)`` index has), so a function that slices map state by ranges calls
    ``sort_index()`` first, as pandas asks of any MultiIndex it did not sort."""
    key_codes, key_levels = pd.factorize(np.asarray(keys, dtype=object))
    user_codes, user_levels = pd.factorize(user_keys)
    return pd.MultiIndex(
        levels=[pd.Index(key_levels, dtype=object), pd.Index(user_levels)],
        codes=[key_codes, user_codes],
        names=["key", "user_key"],
        sortorder=0,
        verify_integrity=False,
    )


def concat_entries(parts: list[pd.Series]) -> pd.Series:
    """State series one after another, as ``pd.concat`` gives them; map state's (key, user key)
    index made with `entry_index` from the parts' level values (pandas appends two
    MultiIndexes through their tuples: in the example job's rounds, 5% of the workers' CPU)."""
    indexes = [p.index for p in parts]
    held = [i for i in indexes if len(i)]
    if not held or not all(isinstance(i, pd.MultiIndex) and i.nlevels == 2 for i in indexes):
        return pd.concat(parts)
    values = pd.concat([p.reset_index(drop=True) for p in parts], ignore_index=True)
    keys = np.concatenate([np.asarray(i.get_level_values(0), dtype=object) for i in held])
    user_keys = np.concatenate([i.get_level_values(1).to_numpy() for i in held])
    values.index = entry_index(keys, user_keys).set_names(list(indexes[0].names))
    values.name = parts[0].name
    return values


TIMERS = "__event_timers__"
"""The keyed state that holds a function's event-time timers: (key, timestamp) -> True."""
PROCESSING_TIMERS = "__processing_timers__"
"""The keyed state that holds its processing-time timers."""
EVENT_TIME, PROCESSING_TIME = "EVENT_TIME", "PROCESSING_TIME"
"""Flink's TimeDomain names: the ``time_domain`` of a fired timer."""

_EMPTY: dict[StateDescriptor, pd.Series] = {}


def empty_series(descriptor: StateDescriptor) -> pd.Series:
    """An empty state series, copied whole from one built per descriptor (building a
    MultiIndex costs 0.5-0.8 ms, a copy 0.1 ms, and stage 2 needs one per key group without
    state); whole, because user code may rename the index it gets."""
    empty = _EMPTY.get(descriptor)
    if empty is None:
        if isinstance(descriptor, MapState):
            index = pd.MultiIndex.from_arrays(
                [pd.Index([], dtype=object), pd.Index([], dtype=descriptor.key_dtype)],
                names=["key", "user_key"],
            )
        else:
            index = pd.Index([], dtype=object, name="key")
        empty = _EMPTY[descriptor] = pd.Series([], index=index, dtype=descriptor.dtype)
    return empty.copy(deep=True)


class KeyedFunction:
    """Stage 2: subclass, declare ``state``, implement ``process``.

    ``process`` gets a round's records for one subtask (a DataFrame with the key column, each
    key's records in source order) and the `KeyedState` of their keys; it returns the records to
    emit (a DataFrame, possibly empty) and updates the state in place, for the keys it was
    given only. ``on_end_of_input`` runs once per subtask with the state of all its keys when a
    bounded source has been read to its end (Flink's final watermark), before the final
    checkpoint."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        raise NotImplementedError

    def on_end_of_input(self, state: KeyedState) -> pd.DataFrame:
        return pd.DataFrame()

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        """Timers that fired this round: a frame with the key column, ``timestamp`` and
        ``time_domain`` (``EVENT_TIME``: the subtask's watermark reached it;
        ``PROCESSING_TIME``: the round's processing time did), in timestamp order within a
        domain (Flink's ``onTimer``), with the `KeyedState` of their keys
        (``state.current_watermark`` is then the watermark that fired them). Defining it gives
        the function timers; it returns the records to emit. A fired timer is gone;
        registering it again makes a new one."""
        return pd.DataFrame()

    def initial_state(self) -> pd.DataFrame | None:
        """Rows (with the key column) to start a job's state from: handed to
        `on_initial_state` in the first round of a fresh start, never after a restore (Spark's
        ``initialState`` of ``transformWithStateInPandas``). Read once on the driver when the
        job starts. None: no initial state."""
        return None

    def on_initial_state(self, rows: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        """A subtask's share of `initial_state`'s rows, with the `KeyedState` of their keys,
        before the first round's records; returns the records to emit. No checkpoint completes
        before every subtask ran it, so a restore always finds it applied."""
        return pd.DataFrame()


def has_initial_state_hook(function: KeyedFunction) -> bool:
    return type(function).on_initial_state is not KeyedFunction.on_initial_state


def has_timers(function: KeyedFunction) -> bool:
    return type(function).on_timer is not KeyedFunction.on_timer


def with_ttl_companions(declared: Mapping[str, StateDescriptor]) -> dict[str, StateDescriptor]:
    """``declared`` and, for each state with a TTL, the state of its entries' last-access
    timestamps (`sparkpoint.agent.time.ttl`): the same kind, int64 milliseconds."""
    found: dict[str, StateDescriptor] = dict(declared)
    for name, descriptor in declared.items():
        if descriptor.ttl is None:
            continue
        stamps: StateDescriptor
        if isinstance(descriptor, MapState):
            stamps = MapState(key_dtype=descriptor.key_dtype, dtype="int64")
        else:
            stamps = type(descriptor)(dtype="int64")
        found.setdefault(ttl_state_name(name), stamps)
    return found


def declared_state(function: KeyedFunction) -> dict[str, StateDescriptor]:
    """The state a function's key groups hold: what it declares, and its timers."""
    declared = with_ttl_companions(function.state)
    if has_timers(function):
        declared[TIMERS] = MapState(key_dtype="int64", dtype="bool")
        declared[PROCESSING_TIMERS] = MapState(key_dtype="int64", dtype="bool")
    return declared


MapFunction = Callable[[pd.DataFrame], pd.DataFrame]


def identity(frame: pd.DataFrame) -> pd.DataFrame:
    return frame


@dataclass(frozen=True)
class Job:
    name: str
    source: Source
    key: str
    function: KeyedFunction
    sink: Sink
    map: MapFunction = identity
    parallelism: int = 2
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    settings: Mapping[str, str] = field(default_factory=dict)
    """Checkpoint settings with Flink's option names (``execution.checkpointing.*``)."""
    job_id: str | None = None
    """Defaults to the name: restarts and ``--restore latest`` find the job by it."""

    def __post_init__(self) -> None:
        check_max_parallelism(self.max_parallelism)
        if not 0 < self.parallelism <= self.max_parallelism:
            raise ValueError(
                f"parallelism must be within 1..{self.max_parallelism}, got {self.parallelism}"
            )
        if not JOB_ID_PATTERN.match(self.id):
            raise ValueError(
                f"job id {self.id!r} must be letters, digits, '.', '_' or '-' (at most 128)"
            )

    @property
    def id(self) -> str:
        return self.job_id or self.name


def load_job(spec: str) -> Job:
    """A job from ``module:attribute``, a file path (``path.py`` or ``path.py:attribute``), or the
    reserved name ``example``. The attribute may be a `Job` or a function returning one."""
    parsed = parse_job_spec(spec)
    target, attribute = parsed.target, parsed.attribute
    if parsed.in_file:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"job file {target} does not exist")
        module_name = f"sparkpoint_job_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    value = getattr(module, attribute, None)
    if value is None:
        raise ValueError(f"{spec}: no attribute {attribute!r}")
    job = value() if callable(value) and not isinstance(value, Job) else value
    if not isinstance(job, Job):
        raise ValueError(f"{spec} is not a sparkpoint Job (got {type(job).__name__})")
    return job
