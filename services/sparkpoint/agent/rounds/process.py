"""Stage 2, inside Spark tasks: one subtask's keyed function over the records of its segments and
the state of their keys, the round's change run and staged output. Takes and returns plain
picklable values; the driver plans and keeps the books (rounds.py, state/books.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sparkpoint.agent.job import KeyedFunction, KeyedState
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.user_code import UserCodeFailure, UserCodeRaised, user_code
from sparkpoint.agent.state import changelog
from sparkpoint.agent.state.backend import read_files, write_file
from sparkpoint.agent.state.changelog import Run
from sparkpoint.agent.state.runs import StateView, SubtaskState, Written
from sparkpoint.agent.time.strategy import MIN_WATERMARK


@dataclass(frozen=True)
class ProcessTask:
    """Only metadata travels to a stage-2 task: segment names, state file names, directories."""

    subtask: int
    channel_dir: str
    segments: list[str]
    """The subtask's segment files (relative to ``channel_dir``), in order."""
    state: SubtaskState
    """The subtask's key groups that have state: their bases and runs, and the compaction the
    driver asks of this round."""
    run_path: str
    """Where the round's change run goes, if it changes any state."""
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
    watermark: int = MIN_WATERMARK
    """The subtask's event-time watermark before the round (`KeyedState.current_watermark`)."""


@dataclass(frozen=True)
class ProcessResult:
    subtask: int
    written: Written
    """The state files the round wrote: its change run, a merge, new bases."""
    output_path: str | None
    """The round's staged output, when it emitted any."""
    output_rows: int = 0
    """Records the round emitted (staged or, at-least-once, made visible)."""


def keep_key_groups(frame: pd.DataFrame, groups: tuple[int, int] | None) -> pd.DataFrame:
    if groups is None or not len(frame):
        return frame
    return frame[frame[KEY_GROUP_COLUMN].between(*groups)]


def process_subtask(task: ProcessTask, function: KeyedFunction) -> ProcessResult:
    """One call of the keyed function for the subtask's round: every record the round brought
    (in segment order, so each key's in source order) with the state of their keys; at the end
    of a bounded input, `on_end_of_input` once with the state of every key the subtask has
    (when it has any). What the function changed is written as the round's change run, one
    file for the subtask (DESIGN.md section 4: a Python call per round, not per key group or
    record); then the compaction the driver asked for."""
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
    # the records' keys, taken before the function runs (it may change the frame)
    keys = records[task.key].to_numpy(copy=True) if len(records) else np.array([], dtype=object)
    key_groups = groups.to_numpy().astype(np.int64)
    view = StateView(task.state, declared)
    # a function without an end-of-input hook needs no other keys' state (reading all of it
    # would hold the whole state in memory at once)
    end_hook = task.end_of_input and has_end_of_input_hook(function)
    if end_hook:
        every_key, every_group = view.everything()
        keys = np.concatenate([np.asarray(keys, dtype=object), every_key])
        key_groups = np.concatenate([key_groups, every_group])
    before = view.lookup(keys, key_groups)
    state = KeyedState(declared, before, task.watermark)
    outputs: list[pd.DataFrame] = []
    if len(records):
        outputs.append(user_code(function.process, records, state))
    if end_hook and any(len(series) for series in state.frames().values()):
        outputs.append(user_code(function.on_end_of_input, state))
    run = round_changes(before, state, keys, key_groups)
    written = Written()
    if run is not None:
        run_groups = tuple(sorted(run.groups()))
        written = Written((task.run_path, view.write(task.run_path, run), run_groups))
    written = view.compact(run, written)
    emitted = [out for out in outputs if out is not None and len(out)]
    rows = sum(len(out) for out in emitted)
    output_path = None
    if emitted and task.emit is None:
        output_path = task.output_path
        write_file(output_path, to_ipc(pd.concat(emitted, ignore_index=True)))
    if emitted and task.emit is not None:
        # at-least-once: visible before the round's result reaches the driver, so before any
        # checkpoint that counts the round's input as processed
        task.emit(pd.concat(emitted, ignore_index=True))
    return ProcessResult(task.subtask, written, output_path, rows)


def has_end_of_input_hook(function: KeyedFunction) -> bool:
    return type(function).on_end_of_input is not KeyedFunction.on_end_of_input


def round_changes(
    before: dict[str, pd.Series], state: KeyedState, keys: np.ndarray, groups: np.ndarray
) -> Run | None:
    """The round's change run; None when the function changed no state."""
    if not state.changed:
        return None
    try:
        run = changelog.changes(before, state.frames(), state.changed, keys, groups)
    except KeyError as exc:
        raise UserCodeRaised(
            UserCodeFailure(
                "KeyError",
                f"state was set for key {exc.args[0]!r}, which is not among the keys the keyed "
                "function was given (a keyed function changes the state of its records' keys "
                "only)",
                "",
            )
        ) from None
    tables = [*run.rows.values(), *(run.replaced or {}).values()]
    return run if any(t.num_rows for t in tables) else None


def output_file(sink_dir: str, round_id: int, subtask: int) -> str:
    return f"{sink_dir}/out-r{round_id:08d}-s{subtask:04d}-{uuid.uuid4().hex[:8]}.arrow"
