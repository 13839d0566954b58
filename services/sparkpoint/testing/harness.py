"""A harness for keyed functions (Flink's ``KeyedOneInputStreamOperatorTestHarness``, Kafka
Streams' ``TopologyTestDriver``): records in, output out, watermarks and processing time moved
by hand, state read per key, snapshots restored with another parallelism or max parallelism. No
Spark, no Kafka, no files: the state lives in an in-memory file system (fsspec's ``memory://``).

It drives the agent's own code, not a copy of it: records are keyed and split by subtask as
stage 1 splits them (`by_subtask`), each subtask's round is the stage-2 task the agent runs
(`process_subtask`: the keyed function, timers, TTL, the round's change run, merges and folds),
its state files join the same books (`StateBackend`), a snapshot names what a checkpoint names
(every key group's base and runs) and a restore is the agent's restore of those files; only the
scheduling around them (one round per call, in this thread) is the harness's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa

from sparkpoint.agent.job import (
    PROCESSING_TIMERS,
    TIMERS,
    Job,
    KeyedFunction,
    MapFunction,
    declared_state,
    has_initial_state_hook,
    identity,
)
from sparkpoint.agent.rounds.fetch import by_subtask
from sparkpoint.agent.rounds.frames import from_ipc, to_ipc
from sparkpoint.agent.rounds.process import ProcessTask, process_subtask
from sparkpoint.agent.rounds.user_code import user_code
from sparkpoint.agent.state import changelog
from sparkpoint.agent.state.backend import read_file, write_file
from sparkpoint.agent.state.books import StateBackend, StateFile, restored_file
from sparkpoint.agent.state.runs import StateView, write
from sparkpoint.agent.time.strategy import MAX_WATERMARK, MIN_WATERMARK
from sparkpoint.common.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_range,
    key_groups,
)

Records: TypeAlias = pd.DataFrame | Iterable[Mapping[str, Any]]
"""Records as a test gives them: a DataFrame, or dicts."""


def frame_of(rows: Records) -> pd.DataFrame:
    return (
        rows.reset_index(drop=True) if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    )


@dataclass(frozen=True)
class HarnessSnapshot:
    """What a checkpoint of the harness holds: every key group's state files (their bytes,
    named as a checkpoint names them), each subtask's watermark over its key groups, the
    processing time. Self-contained and picklable; restore it with `KeyedFunctionHarness.restore`."""

    files: Mapping[str, tuple[bytes, int, int]]
    """Copy name -> (bytes, first key group, last key group)."""
    max_parallelism: int
    watermarks: Sequence[tuple[int, int, int]]
    """(first key group, last key group, watermark) per subtask."""
    processing_time: int

    @property
    def state_bytes(self) -> int:
        return sum(len(data) for data, _, _ in self.files.values())


@dataclass
class KeyedFunctionHarness:
    """One keyed function with ``parallelism`` subtasks over ``max_parallelism`` key groups.
    Each call is a round: the records given (mapped by ``map`` as the job's map runs, keyed by
    ``key``) go to the subtasks that own their keys, each subtask calls the function once with
    its records and their keys' state, then fires the timers now due. Every call returns that
    round's output; `output` has everything emitted so far."""

    function: KeyedFunction
    key: str
    parallelism: int = 1
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    map: MapFunction = identity
    processing_time: int = 0
    """The processing-time clock (ms), moved only by `set_processing_time`: TTL and
    processing-time timers read it."""
    materialize_interval_s: float = 600.0
    """How often (in processing-time seconds) a key group's runs are folded into a new base, as
    ``state.backend.changelog.periodic-materialize.interval`` sets it in the agent."""
    _root: str = field(init=False, default="")
    _backend: StateBackend = field(init=False)
    _watermarks: list[int] = field(init=False, default_factory=list)
    _outputs: list[pd.DataFrame] = field(init=False, default_factory=list)
    _rounds: int = field(init=False, default=0)
    _initial: dict[int, pd.DataFrame] = field(init=False, default_factory=dict)
    """The function's initial state per subtask, until the first round hands it over."""

    def __post_init__(self) -> None:
        self._root = f"memory://sparkpoint-harness-{uuid.uuid4().hex}"
        self._backend = StateBackend(
            f"{self._root}/state", materialize_interval_s=self.materialize_interval_s
        )
        self._watermarks = [MIN_WATERMARK] * self.parallelism
        key_group_range(self.max_parallelism, self.parallelism, 0)  # checks both
        initial = self.function.initial_state() if has_initial_state_hook(self.function) else None
        if initial is not None and len(initial):  # a fresh start: the first round applies it
            parts = by_subtask(initial.reset_index(drop=True), self.key, self.max_parallelism, self.parallelism)  # fmt: skip
            self._initial = dict(parts)

    @classmethod
    def of_job(cls, job: Job, parallelism: int | None = None) -> KeyedFunctionHarness:
        """The keyed stage of ``job``: its function, key, map, parallelism and max parallelism."""
        return cls(
            job.function, job.key, parallelism or job.parallelism, job.max_parallelism, job.map
        )

    @property
    def ranges(self) -> list[KeyGroupRange]:
        return [
            key_group_range(self.max_parallelism, self.parallelism, i)
            for i in range(self.parallelism)
        ]

    @property
    def watermark(self) -> int:
        """The lowest subtask watermark (each subtask's is `KeyedState.current_watermark`)."""
        return min(self._watermarks)

    # --- input ---------------------------------------------------------------------------------

    def process(self, records: Records) -> pd.DataFrame:
        """One round over ``records``: each subtask with records calls the function once (a
        key's records in the order given), then fires its timers due at its watermark."""
        frame = frame_of(records)
        if len(frame):
            frame = user_code(self.map, frame)
        parts = dict(by_subtask(frame, self.key, self.max_parallelism, self.parallelism)) if len(frame) else {}  # fmt: skip
        return self._round({i: [part] for i, part in parts.items()})

    def process_watermark(self, watermark: int) -> pd.DataFrame:
        """The watermark reaches ``watermark`` (ms) in every subtask: event-time timers at or
        below it fire, in timestamp order per subtask (Flink's ``processWatermark``). A watermark
        never goes back."""
        self._watermarks = [max(w, watermark) for w in self._watermarks]
        return self._round({})

    def set_processing_time(self, time_ms: int) -> pd.DataFrame:
        """Processing time moves to ``time_ms``: processing-time timers at or below it fire, and
        state TTL counts from it (Flink's ``setProcessingTime``)."""
        if time_ms < self.processing_time:
            raise ValueError(
                f"processing time goes forward only: {time_ms} < {self.processing_time}"
            )
        self.processing_time = time_ms
        return self._round({})

    def end_input(self) -> pd.DataFrame:
        """The input ended, as a bounded job's last round does it: the final watermark fires
        every event-time timer (Flink's ``MAX_WATERMARK`` at the end of a bounded source), then
        every subtask runs its function's ``on_end_of_input`` over the state of all its keys
        (Flink's ``endInput``)."""
        self._watermarks = [MAX_WATERMARK for _ in self._watermarks]
        return self._round({}, end_of_input=True)

    # --- output and state ----------------------------------------------------------------------

    @property
    def output(self) -> pd.DataFrame:
        """Everything emitted so far, in the order emitted (per round: subtask by subtask)."""
        frames = [f for f in self._outputs if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def take_output(self) -> pd.DataFrame:
        """`output`, then forgotten (Kafka Streams' ``readValuesToList``)."""
        out = self.output
        self._outputs.clear()
        return out

    def state(self, name: str) -> pd.Series:
        """State ``name`` of every key, as the function reads it (indexed by key; a map state
        by (key, user key); a list state one row per element), as stored: entries whose TTL ran
        out are dropped when a function reads them or a fold writes a base."""
        descriptor = self._declared().get(name)
        if descriptor is None:
            raise KeyError(f"no state {name!r}: the function declares {sorted(self._declared())}")
        return self._everything()[name]

    def state_of(self, key: object) -> dict[str, Any]:
        """Every declared state of one key (None, [] or {} when it has none)."""
        found: dict[str, Any] = {}
        everything = self._everything()
        for name in declared_state(self.function):
            if name.startswith("__"):
                continue
            series = everything[name]
            if isinstance(series.index, pd.MultiIndex):
                mine = series[series.index.get_level_values(0) == key]
                found[name] = dict(zip(mine.index.get_level_values(1), mine.tolist(), strict=True))
            else:
                mine = series[series.index == key]
                values = mine.tolist()
                found[name] = (
                    values if _is_list(self._declared()[name]) else (values[0] if values else None)
                )
        return found

    def timers(self) -> pd.DataFrame:
        """Pending timers: key, timestamp, time domain."""
        everything = self._everything()
        frames = []
        for name, label in ((TIMERS, "EVENT_TIME"), (PROCESSING_TIMERS, "PROCESSING_TIME")):
            series = everything.get(name)
            if series is not None and len(series):
                frames.append(
                    pd.DataFrame(
                        {
                            self.key: series.index.get_level_values(0),
                            "timestamp": series.index.get_level_values(1).astype("int64"),
                            "time_domain": label,
                        }
                    )
                )
        if not frames:
            return pd.DataFrame(columns=[self.key, "timestamp", "time_domain"])
        return pd.concat(frames, ignore_index=True).sort_values("timestamp", kind="stable")

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> HarnessSnapshot:
        """A checkpoint: the files every key group's chain names (its base and the runs written
        since), copied under the names a checkpoint gives them."""
        files: dict[str, tuple[bytes, int, int]] = {}
        seen: set[str] = set()
        for chain in self._backend.chains.values():
            for f in chain.durable():
                if f.path not in seen:
                    seen.add(f.path)
                    files[f.copy_name()] = (read_file(f.path), f.first, f.last)
        watermarks = [
            (r.start, r.end, w) for r, w in zip(self.ranges, self._watermarks, strict=True)
        ]
        return HarnessSnapshot(files, self.max_parallelism, watermarks, self.processing_time)

    @classmethod
    def restore(
        cls,
        snapshot: HarnessSnapshot,
        function: KeyedFunction,
        key: str,
        parallelism: int = 1,
        max_parallelism: int | None = None,
        map: MapFunction = identity,
    ) -> KeyedFunctionHarness:
        """A harness started from ``snapshot``, with any parallelism: each subtask gets the key
        groups it owns now and starts at the lowest watermark their old subtasks stood at. With
        another ``max_parallelism`` every key's state is moved to its key group under the new
        one first (what Flink's State Processor API does; a job's restore refuses it)."""
        harness = cls(
            function, key, parallelism, max_parallelism or snapshot.max_parallelism, map,
            snapshot.processing_time,
        )  # fmt: skip
        if harness.max_parallelism != snapshot.max_parallelism:
            snapshot = harness._rekeyed(snapshot)
        restored: list[StateFile] = []
        for name, (data, first, last) in snapshot.files.items():
            path = f"{harness._root}/restored/{name}"
            write_file(path, data)
            restored.append(restored_file(path, len(data), first, last))
        harness._initial = {}  # a restore never applies the initial state again
        backend = harness._backend
        backend.restore(restored, shared=False, now=harness._now_s)
        groups = {g for f in restored for g in range(f.first, f.last + 1)}
        backend.timers.restored(groups)
        backend.processing_timers.restored(groups)
        harness._watermarks = [
            min(
                (w for first, last, w in snapshot.watermarks if first <= r.end and r.start <= last),
                default=MIN_WATERMARK,
            )
            for r in harness.ranges
        ]
        return harness

    def close(self) -> None:
        """Frees the in-memory files."""
        fs = fsspec.filesystem("memory")
        path = self._root.removeprefix("memory://")
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def __enter__(self) -> KeyedFunctionHarness:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- inside --------------------------------------------------------------------------------

    @property
    def _now_s(self) -> float:
        return self.processing_time / 1000

    def _declared(self) -> dict[str, Any]:
        return dict(declared_state(self.function))

    def _round(
        self, parts: Mapping[int, list[pd.DataFrame]], end_of_input: bool = False
    ) -> pd.DataFrame:
        """The subtasks with records, with due timers, with a share of the initial state or
        (end of input) all of them, each run as the agent runs a stage-2 part."""
        self._rounds += 1
        emitted = [
            out
            for i in range(self.parallelism)
            if (out := self._subtask_round(i, parts.get(i, []), end_of_input)) is not None
        ]
        out = pd.concat(emitted, ignore_index=True) if emitted else pd.DataFrame()
        self._outputs.append(out)
        return out

    def _subtask_round(
        self, i: int, parts: list[pd.DataFrame], end_of_input: bool
    ) -> pd.DataFrame | None:
        """Subtask ``i``'s part of the round (None: it has nothing to do); what it wrote joins
        the books, as `Rounds.collect_process` installs it."""
        backend, groups = self._backend, self.ranges[i]
        seq = backend.seq(self._rounds)
        event = backend.timers.due(groups, self._watermarks[i])
        processing = backend.processing_timers.due(groups, self.processing_time)
        initial = self._initial.pop(i, None)
        if not (parts or event or processing or end_of_input or initial is not None):
            return None
        segments = []
        for n, part in enumerate(parts):
            name = f"r{self._rounds:08d}-s{i:04d}-{n}.arrow"
            write_file(f"{self._root}/channel/{name}", to_ipc(part))
            segments.append(name)
        initial_path = None
        if initial is not None:
            initial_path = f"{self._root}/initial/s{i:04d}.arrow"
            write_file(initial_path, to_ipc(initial))
        asked = backend.subtask_state(groups, seq, i, self._now_s)
        task = ProcessTask(
            i, f"{self._root}/channel", segments, asked, backend.run_path(seq, i),
            f"{self._root}/out/r{self._rounds:08d}-s{i:04d}.arrow", end_of_input,
            None, self.key, None, self._watermarks[i], self._watermarks[i], event,
            self.processing_time, processing, initial_path,
        )  # fmt: skip
        result = process_subtask(task, self.function)
        backend.install(asked, result.written, seq, self._now_s)
        for label, index in (("EVENT_TIME", backend.timers), ("PROCESSING_TIME", backend.processing_timers)):  # fmt: skip
            index.update(result.timers_exact.get(label, {}), result.timers_lowered.get(label, {}))
        return from_ipc(result.output_path) if result.output_path is not None else None

    def _everything(self) -> dict[str, pd.Series]:
        """Every key's state, all subtasks together."""
        every = KeyGroupRange(0, self.max_parallelism - 1)
        view = StateView(
            self._backend.subtask_state(every, 0, 0, 0.0), declared_state(self.function)
        )
        keys, groups = view.everything()
        return view.lookup(keys, groups)

    def _rekeyed(self, snapshot: HarnessSnapshot) -> HarnessSnapshot:
        """``snapshot``'s state as bases of this harness's key groups: each old key group folded
        (as a canonical savepoint folds it), every key's rows moved to its new key group."""
        old = KeyedFunctionHarness.restore(snapshot, self.function, self.key, 1)
        try:
            every = KeyGroupRange(0, old.max_parallelism - 1)
            view = StateView(
                old._backend.subtask_state(every, 0, 0, 0.0), declared_state(self.function)
            )
            tables: dict[str, list[pa.Table]] = {}
            for group in sorted(old._backend.chains):
                for name, table in view.folded(group).rows.items():
                    if table.num_rows:
                        tables.setdefault(name, []).append(table.drop_columns([changelog.KH]))
            by_group: dict[int, dict[str, pa.Table]] = {}
            for name, parts in tables.items():
                table = pa.concat_tables(parts)
                keys = np.asarray(table.column("key").to_numpy(zero_copy_only=False), dtype=object)
                groups = key_groups(keys, self.max_parallelism).astype(np.int64)
                kh = changelog.positions(groups, keys)
                order = np.argsort(kh, kind="stable")
                rekeyed = table.take(pa.array(order)).add_column(
                    0, changelog.KH, pa.array(kh[order])
                )
                for group in np.unique(groups):
                    mine = pa.array(groups[order] == group)
                    by_group.setdefault(int(group), {})[name] = rekeyed.filter(mine)
            files: dict[str, tuple[bytes, int, int]] = {}
            for group, rows in by_group.items():
                base = StateFile("", 0, 0, group, group, "base").copy_name()
                path = f"{self._root}/rekeyed/{base}"
                write(path, changelog.Run(rows))
                files[base] = (read_file(path), group, group)
        finally:
            old.close()
        low = min((w for _, _, w in snapshot.watermarks), default=MIN_WATERMARK)
        return HarnessSnapshot(
            files,
            self.max_parallelism,
            [(0, self.max_parallelism - 1, low)],
            snapshot.processing_time,
        )


def _is_list(descriptor: object) -> bool:
    from sparkpoint.agent.job import ListState

    return isinstance(descriptor, ListState)
