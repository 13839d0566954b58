"""Stage 2, inside Spark tasks: one subtask's keyed function over its key groups (the records of
its segments, the state of the key groups they touch), new state versions and staged output.
Takes and returns plain picklable values; the driver plans and keeps the books (rounds.py)."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sparkpoint.agent.job import (
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    empty_series,
)
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.user_code import UserCodeFailure, UserCodeRaised, user_code
from sparkpoint.agent.state.backend import (
    decode_state,
    encode_state,
    read_files,
    working_path,
    write_files,
)


@dataclass(frozen=True)
class ProcessTask:
    """Only metadata travels to a stage-2 task: segment names, state versions, directories."""

    subtask: int
    channel_dir: str
    segments: list[str]
    """The subtask's segment files (relative to ``channel_dir``), in order."""
    versions: dict[int, int | str]
    """Every key group of this subtask that has state: its working version (a round number:
    the file is `working_path`), or the path of a restored file."""
    state_dir: str
    version: int
    output_path: str
    end_of_input: bool = False
    segment_key_groups: list[tuple[int, int] | None] | None = None
    """Per segment, the key groups whose rows it holds for this subtask (None: all its rows).
    Restored channel state was written for the old parallelism's subtasks: a file may also
    hold rows of key groups another subtask owns now, which this one drops."""
    key: str = ""
    """The records' key column."""
    emit: Callable[[pd.DataFrame], int] | None = None
    """At-least-once sinks: makes the round's output visible from the task at once (the
    sink's `direct`); None: the output is staged at ``output_path``."""

    def state_file(self, group: int) -> str | None:
        found = self.versions.get(group)
        if found is None or isinstance(found, str):
            return found
        return working_path(self.state_dir, group, found)


@dataclass(frozen=True)
class ProcessResult:
    subtask: int
    new_versions: dict[int, int]
    """Key group -> size of its new state file (at `working_path` for the task's version), for
    every key group whose state changed."""
    output_path: str | None
    """The round's staged output, when it emitted any."""
    output_rows: int = 0
    """Records the round emitted (staged or, at-least-once, made visible)."""


_CACHE: OrderedDict[str, dict[str, pd.Series]] = OrderedDict()
"""Decoded state files by path, per Python worker (Spark reuses workers): files never change,
so a path is a safe key."""
CACHE_ENTRIES = 512


WRITE_BATCH_BYTES = 64 << 20
"""Stage 2 writes a round's files in batches of about this many bytes (`write_files`: on an
object store a batch's PUTs are in flight together)."""


def load_states(
    paths: Mapping[int, str], declared: Mapping[str, StateDescriptor]
) -> dict[int, dict[str, pd.Series]]:
    """Key group -> its state file's series, from the worker's cache when it has them (shared,
    never to be changed in place: `merged_state` concatenates them into new series); the files
    it lacks are read together (`read_files`)."""
    loaded: dict[int, dict[str, pd.Series]] = {}
    missing: dict[str, int] = {}
    for group, path in paths.items():
        frames = _CACHE.get(path)
        if frames is None:
            missing[path] = group
        else:
            _CACHE.move_to_end(path)
            loaded[group] = frames
    for path, data in read_files(missing).items():
        loaded[missing[path]] = frames = decode_state(data, declared)
        remember(path, frames)
    return {group: loaded[group] for group in paths}


def remember(path: str, frames: dict[str, pd.Series]) -> None:
    _CACHE[path] = frames
    while len(_CACHE) > CACHE_ENTRIES:
        _CACHE.popitem(last=False)


def keep_key_groups(frame: pd.DataFrame, groups: tuple[int, int] | None) -> pd.DataFrame:
    if groups is None or not len(frame):
        return frame
    return frame[frame[KEY_GROUP_COLUMN].between(*groups)]


def merged_state(
    loaded: Mapping[int, Mapping[str, pd.Series]], declared: Mapping[str, StateDescriptor]
) -> dict[str, pd.Series]:
    """The state of several key groups as one series per declared state (new series: the
    cached ones stay as they were)."""
    merged: dict[str, pd.Series] = {}
    for name, descriptor in declared.items():
        parts = [frames[name] for frames in loaded.values() if name in frames]
        merged[name] = (pd.concat(parts) if parts else empty_series(descriptor)).astype(
            descriptor.dtype
        )
    return merged


def key_owners(
    loaded: Mapping[int, Mapping[str, pd.Series]], keys: np.ndarray, groups: pd.Series
) -> pd.Series:
    """Key -> key group for every key the call was given: the keys of the loaded state files
    and of the round's records."""
    owners = [
        pd.Series(group, index=series.index.get_level_values(0).unique())
        for group, frames in loaded.items()
        for series in frames.values()
        if len(series)
    ]
    owners.append(pd.Series(groups.to_numpy(), index=keys))
    found = pd.concat(owners)
    return found[~found.index.duplicated()]


def split_state(name: str, series: pd.Series, owners: pd.Series) -> dict[int, pd.Series]:
    """One merged state series, back into its key groups' series."""
    if not len(series):
        return {}
    keys = series.index.get_level_values(0)
    groups = owners.reindex(keys)
    if groups.isna().any():
        stranger = keys[groups.isna().to_numpy()][0]
        raise UserCodeRaised(
            UserCodeFailure(
                "KeyError",
                f"state {name!r} was set for key {stranger!r}, which is not among the keys the "
                "keyed function was given (a keyed function changes the state of its records' "
                "keys only)",
                "",
            )
        )
    return {int(g): part for g, part in series.groupby(groups.to_numpy(), sort=False)}


def process_subtask(task: ProcessTask, function: KeyedFunction) -> ProcessResult:
    """One call of the keyed function for the subtask's round: every record the round brought
    (in segment order, so each key's in source order) with the merged state of the key groups
    they belong to; at the end of a bounded input, `on_end_of_input` once with the state of
    every key group the subtask has (when it has any). The state is then split back per key
    group, and each key group the call had gets a new state version (DESIGN.md section 4:
    state stays per key group, a Python call per round, not per key group or record)."""
    declared = function.state
    ranges = task.segment_key_groups or [None] * len(task.segments)
    paths = [f"{task.channel_dir}/{name}" for name in task.segments]
    segment_bytes = read_files(paths)  # on an object store, fetched together
    frames = [
        keep_key_groups(from_ipc(segment_bytes[path]), groups)
        for path, groups in zip(paths, ranges, strict=True)
    ]
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    groups = records.pop(KEY_GROUP_COLUMN) if len(records) else pd.Series([], dtype="int32")
    had = {int(g) for g in groups.unique()}
    if task.end_of_input:
        had |= set(task.versions)
    loaded = load_states({g: path for g in sorted(had) if (path := task.state_file(g))}, declared)
    # the records' keys, taken before the function runs (it may change the frame)
    keys = records[task.key].to_numpy(copy=True) if len(records) else np.array([], dtype=object)
    state = KeyedState(declared, merged_state(loaded, declared))
    outputs: list[pd.DataFrame] = []
    if len(records):
        outputs.append(user_code(function.process, records, state))
    if task.end_of_input and any(len(series) for series in state.frames().values()):
        outputs.append(user_code(function.on_end_of_input, state))
    batch = WriteBatch()
    new_versions = (
        write_states(task, batch, state, loaded, key_owners(loaded, keys, groups), had)
        if state.changed
        else {}
    )
    emitted = [out for out in outputs if out is not None and len(out)]
    rows = sum(len(out) for out in emitted)
    output_path = None
    if emitted and task.emit is None:
        output_path = task.output_path
        batch.add(output_path, to_ipc(pd.concat(emitted, ignore_index=True)))
    batch.flush()
    if emitted and task.emit is not None:
        # at-least-once: visible before the round's result reaches the driver, so before any
        # checkpoint that counts the round's input as processed
        task.emit(pd.concat(emitted, ignore_index=True))
    return ProcessResult(task.subtask, new_versions, output_path, rows)


def write_states(
    task: ProcessTask,
    batch: WriteBatch,
    state: KeyedState,
    loaded: dict[int, dict[str, pd.Series]],
    owners: pd.Series,
    had: set[int],
) -> dict[int, int]:
    """The state the function changed, split back per key group (``owners``: each key's key
    group) and written as each key group's new version; returns the key groups written and the
    size of each new file."""
    declared = state.declared
    split = {
        name: split_state(name, series, owners)
        for name, series in state.frames().items()
        if name in state.changed
    }
    new_versions: dict[int, int] = {}
    for group in sorted(had.union(*split.values())):
        before = loaded.get(group)
        frames_of_group = {
            name: split[name].get(group, empty_series(descriptor))
            if name in split
            else (before or {}).get(name, empty_series(descriptor))
            for name, descriptor in declared.items()
        }
        if before is None and not any(len(f) for f in frames_of_group.values()):
            continue  # no state before, none now: nothing to keep
        data = encode_state(frames_of_group)
        batch.add(working_path(task.state_dir, group, task.version), data, frames_of_group)
        new_versions[group] = len(data)
    return new_versions


@dataclass
class WriteBatch:
    """A stage-2 task's new files, written together (`write_files`) once they hold
    `WRITE_BATCH_BYTES`, and at the end; a state file's series enter the worker's cache once
    the file is written."""

    files: dict[str, bytes] = field(default_factory=dict)
    frames: dict[str, dict[str, pd.Series]] = field(default_factory=dict)
    size: int = 0

    def add(self, path: str, data: bytes, frames: dict[str, pd.Series] | None = None) -> None:
        self.files[path] = data
        if frames is not None:
            self.frames[path] = frames
        self.size += len(data)
        if self.size >= WRITE_BATCH_BYTES:  # bounds the memory a round holds
            self.flush()

    def flush(self) -> None:
        write_files(self.files)
        for path, frames in self.frames.items():
            remember(path, frames)
        self.files, self.frames, self.size = {}, {}, 0


def output_file(sink_dir: str, round_id: int, subtask: int) -> str:
    return f"{sink_dir}/out-r{round_id:08d}-s{subtask:04d}-{uuid.uuid4().hex[:8]}.arrow"
