"""Stage 2, inside Spark tasks: one subtask's keyed function over the records of its segments and
the state of their keys, the round's change run and staged output. Takes and returns plain
picklable values; the driver plans and keeps the books (rounds.py, state/books.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sparkpoint.agent.job import (
    EVENT_TIME,
    PROCESSING_TIME,
    PROCESSING_TIMERS,
    TIMERS,
    KeyedFunction,
    KeyedState,
    concat_entries,
    declared_state,
    has_timers,
)
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
    watermark_after: int = MIN_WATERMARK
    """Its watermark once the round's segments are processed: timers up to it fire."""
    timer_groups: list[int] = field(default_factory=list)
    """Key groups that may hold timers up to ``watermark_after`` (the driver's `TimerIndex`):
    their timers are read whole."""
    processing_time: int = 0
    """The round's processing time (ms since the epoch, the driver's clock at planning)."""
    processing_timer_groups: list[int] = field(default_factory=list)
    """Key groups that may hold processing-time timers up to ``processing_time``."""
    initial_segment: str | None = None
    """A fresh start's first round: the subtask's share of the job's initial state
    (`rounds.initial`), handed to ``on_initial_state`` before the records."""


@dataclass(frozen=True)
class ProcessResult:
    subtask: int
    written: Written
    """The state files the round wrote: its change run, a merge, new bases."""
    output_path: str | None
    """The round's staged output, when it emitted any."""
    output_rows: int = 0
    """Records the round emitted (staged or, at-least-once, made visible)."""
    timers_exact: dict[str, dict[int, int | None]] = field(default_factory=dict)
    """Per time domain, the earliest pending timer of each key group whose timers the round
    read whole."""
    timers_lowered: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per time domain, the earliest timer the round's keys hold in the other key groups."""
    timers_fired: int = 0


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
    declared = declared_state(function)
    records, keys, key_groups = round_records(task)
    initial, keys, key_groups = initial_rows(task, keys, key_groups)
    keys, key_groups = distinct_keys(keys, key_groups)
    view = StateView(task.state, declared)
    # a function without an end-of-input hook needs no other keys' state (reading all of it
    # would hold the whole state in memory at once)
    end_hook = task.end_of_input and has_end_of_input_hook(function)
    if end_hook:
        every_key, every_group = view.everything()
        keys = np.concatenate([np.asarray(keys, dtype=object), every_key])
        key_groups = np.concatenate([key_groups, every_group])
    before = view.lookup(keys, key_groups)
    state = KeyedState(declared, before, task.watermark, task.processing_time, task.key)
    outputs: list[pd.DataFrame] = []
    if len(initial):
        outputs.append(user_code(function.on_initial_state, initial, state))
    if len(records):
        outputs.append(user_code(function.process, records, state))
    timers = TimersFired()
    if has_timers(function):
        timers = fire_every_domain(task, function, view, state, before, keys, key_groups)
        keys, key_groups = timers.keys, timers.groups
        outputs += timers.outputs
    if end_hook and any(len(series) for series in state.frames().values()):
        outputs.append(user_code(function.on_end_of_input, state))
    run = round_changes(before, state, keys, key_groups)
    written = Written()
    if run is not None:
        run_groups = tuple(sorted(run.groups()))
        written = Written((task.run_path, view.write(task.run_path, run), run_groups))
    written = view.compact(run, written, task.processing_time or int(time.time() * 1000))
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
    return ProcessResult(
        task.subtask, written, output_path, rows, timers.exact, timers.lowered, timers.count
    )


def round_records(task: ProcessTask) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The round's records (its segments in order, each holding only the subtask's key groups)
    and their keys and key groups, the keys taken before the function runs (it may change the
    frame)."""
    ranges = task.segment_key_groups or [None] * len(task.segments)
    paths = [f"{task.channel_dir}/{name}" for name in task.segments]
    segment_bytes = read_files(paths)  # on an object store, fetched together
    frames = [
        keep_key_groups(from_ipc(segment_bytes[path]), groups)
        for path, groups in zip(paths, ranges, strict=True)
    ]
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    groups = records.pop(KEY_GROUP_COLUMN) if len(records) else pd.Series([], dtype="int32")
    keys = records[task.key].to_numpy(copy=True) if len(records) else np.array([], dtype=object)
    return records, keys, groups.to_numpy().astype(np.int64)


def distinct_keys(keys: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each key once (with its key group), in first-seen order: a round's records repeat their
    keys, and what reads and writes state needs each once (hashed, not sorted: sorting Python
    strings cost 60 ms a round of 100,000 records)."""
    if not len(keys):
        return keys, groups
    first = ~pd.Index(np.asarray(keys, dtype=object)).duplicated()
    return np.asarray(keys, dtype=object)[first], np.asarray(groups)[first]


def initial_rows(
    task: ProcessTask, keys: np.ndarray, groups: np.ndarray
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The subtask's share of the job's initial state (empty unless this is a fresh start's
    first round), and the round's keys and key groups with its keys added (their state is read
    with the records')."""
    if not task.initial_segment:
        return pd.DataFrame(), keys, groups
    initial = from_ipc(task.initial_segment)
    initial_groups = initial.pop(KEY_GROUP_COLUMN).to_numpy().astype(np.int64)
    initial_keys = np.asarray(initial[task.key].to_numpy(copy=True), dtype=object)
    return (
        initial,
        np.concatenate([initial_keys, np.asarray(keys, dtype=object)]),
        np.concatenate([initial_groups, groups]),
    )


MAX_FIRINGS = 1_000
"""Timers an `on_timer` call registers at or below the watermark fire in the same round, in
turns; at most this many turns (a function that always registers another one is stopped)."""


@dataclass(frozen=True)
class TimerDomain:
    label: str
    """``EVENT_TIME`` or ``PROCESSING_TIME`` (Flink's TimeDomain)."""
    state_name: str
    until: int
    """Its timers at or below this fire."""
    groups: list[int]
    """The key groups whose stored timers are read."""


def timer_domains(task: ProcessTask) -> list[TimerDomain]:
    """Event time first (the watermark after the round's records), then processing time."""
    return [
        TimerDomain(EVENT_TIME, TIMERS, task.watermark_after, task.timer_groups),
        TimerDomain(
            PROCESSING_TIME, PROCESSING_TIMERS, task.processing_time,
            task.processing_timer_groups,
        ),
    ]  # fmt: skip


@dataclass
class TimersFired:
    """What a round's timers did, over both time domains."""

    keys: np.ndarray = field(default_factory=lambda: np.array([], dtype=object))
    groups: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    outputs: list[pd.DataFrame] = field(default_factory=list)
    exact: dict[str, dict[int, int | None]] = field(default_factory=dict)
    lowered: dict[str, dict[int, int]] = field(default_factory=dict)
    count: int = 0


def fire_every_domain(
    task: ProcessTask,
    function: KeyedFunction,
    view: StateView,
    state: KeyedState,
    before: dict[str, pd.Series],
    keys: np.ndarray,
    groups: np.ndarray,
) -> TimersFired:
    done = TimersFired(keys, groups)
    for domain in timer_domains(task):
        fire_timers(task, function, view, state, before, done, domain)
    return done


def fire_timers(
    task: ProcessTask,
    function: KeyedFunction,
    view: StateView,
    state: KeyedState,
    before: dict[str, pd.Series],
    done: TimersFired,
    domain: TimerDomain,
) -> None:
    """Fires the subtask's timers of one domain up to ``domain.until`` (event time: its
    watermark after the round), in timestamp order (Flink: records before a watermark first,
    then the timers it fires). The round's keys' timers are in ``state``; the other keys of the
    key groups the driver named are read from storage, and their state is added to ``state``
    (and ``before``) when a timer of theirs fires. Adds to ``done`` the outputs, the keys and
    key groups the round now covers, and what the driver's `TimerIndex` learns."""
    watermark = domain.until
    others = stored_timers(domain, view, set(done.keys.tolist()))
    if len(others):
        due = others[others["timestamp"] <= watermark].drop_duplicates("key")
        if len(due):
            new_keys = due["key"].to_numpy(dtype=object)
            new_groups = due["group"].to_numpy(dtype=np.int64)
            found = view.lookup(new_keys, new_groups)
            state.add_keys(found)
            for name, series in found.items():
                before[name] = (
                    concat_entries([before[name], series]) if len(series) else before[name]
                )
            done.keys = np.concatenate([np.asarray(done.keys, dtype=object), new_keys])
            done.groups = np.concatenate([done.groups, new_groups])
            others = others[~others["key"].isin(set(new_keys.tolist()))]
    if domain.label == EVENT_TIME:
        state.current_watermark = watermark
    for _ in range(MAX_FIRINGS):
        due_now = state.pop_due_timers(domain.state_name, watermark)
        if not len(due_now):
            break
        order = np.argsort(due_now.to_numpy(), kind="stable")
        frame = pd.DataFrame(
            {
                task.key: due_now.index.to_numpy(dtype=object)[order],
                "timestamp": due_now.to_numpy()[order],
                "time_domain": domain.label,
            }
        )
        done.count += len(frame)
        done.outputs.append(user_code(function.on_timer, frame, state))
    pending = (
        state.event_time_timers if domain.label == EVENT_TIME else state.processing_time_timers
    )
    earliest = earliest_timers(pending(), done, others)
    scanned = set(domain.groups)
    done.exact[domain.label] = {g: earliest.get(g) for g in scanned}
    done.lowered[domain.label] = {g: t for g, t in earliest.items() if g not in scanned}


def stored_timers(domain: TimerDomain, view: StateView, have: set[object]) -> pd.DataFrame:
    """The timers (key, timestamp, group) stored in the key groups the driver named, of keys
    the round does not already hold: those key groups folded together, in one call."""
    if not domain.groups:
        return pd.DataFrame()
    table = view.folded_groups(domain.groups, only=domain.state_name).rows.get(domain.state_name)
    if table is None or not table.num_rows:
        return pd.DataFrame()
    found = pd.DataFrame(
        {
            "key": np.asarray(table.column("key").to_numpy(zero_copy_only=False), dtype=object),
            "timestamp": table.column("user_key").to_numpy(zero_copy_only=False),
            "group": changelog.groups_of(table.column(changelog.KH).to_numpy()),
        }
    )
    return found[~found["key"].isin(have)] if have else found


def earliest_timers(pending: pd.Series, fired: TimersFired, others: pd.DataFrame) -> dict[int, int]:
    """Per key group, the earliest timer still pending: of the keys the round holds
    (``pending``), and of the stored ones it did not take."""
    parts: list[pd.Series] = []
    if len(pending):
        group_of = pd.Series(fired.groups, index=pd.Index(fired.keys, dtype=object))
        group_of = group_of[~group_of.index.duplicated()]
        groups = group_of.reindex(pending.index).to_numpy()
        parts.append(pd.Series(pending.to_numpy(), dtype="int64").groupby(groups).min())
    if len(others):
        parts.append(others.groupby("group")["timestamp"].min().astype("int64"))
    if not parts:
        return {}
    earliest = pd.concat(parts).groupby(level=0).min()
    return {int(g): int(t) for g, t in earliest.items()}


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
