"""Stage 2's side of keyed state, inside a Spark task: the subtask's key groups as the driver's
books describe them (`SubtaskState`: each key group's base and runs, by path), the files read
through a per-worker cache, the round's keys looked up, the round's change run written, and the
compaction the driver asked for (a merge of runs, key groups folded into new bases)."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from sparkpoint.agent.job import StateDescriptor
from sparkpoint.agent.state import changelog, local
from sparkpoint.agent.state.backend import (
    decode_state,
    local_path,
    read_files,
    split_segment,
    write_file,
)
from sparkpoint.agent.state.changelog import Run

CACHE_FILES = 1024
"""Decoded files a Python worker keeps (Spark reuses workers). A local file is memory-mapped:
its rows stay on disk (in the page cache) until a lookup takes them, so an entry costs little
memory."""
CACHE_BYTES = 256 << 20
"""Bytes of files read whole (from an object store) a worker keeps at most."""


@dataclass(frozen=True)
class SubtaskState:
    """What a stage-2 task is told of its subtask's state: only paths travel."""

    chains: dict[int, tuple[str | None, tuple[str, ...]]]
    """Key group -> its base (None: no base yet) and its runs, newest first."""
    seqs: dict[str, int]
    """Run path -> the round it holds changes up to: orders runs of several key groups."""
    legacy: frozenset[str] = frozenset()
    """Bases in the earlier format (one key group's whole state, from an older checkpoint)."""
    merge: tuple[str, ...] = ()
    """Runs to merge into one (``merge_path``), newest first."""
    merge_path: str = ""
    materialize: tuple[int, ...] = ()
    """Key groups to fold into a new base after this round (at ``base_paths``)."""
    base_paths: dict[int, str] = field(default_factory=dict)
    local_dir: str | None = None
    """Where files of an object store are kept on this machine's disk (state/local.py); None:
    the state is on local disk already."""
    memory_bytes: int = CACHE_BYTES
    """The worker's budget for files held in memory (``state.backend.memory.fixed-per-slot``)."""

    def live(self) -> dict[str, set[int]]:
        """Run path -> the key groups whose chains hold it."""
        found: dict[str, set[int]] = {}
        for group, (_, runs) in self.chains.items():
            for path in runs:
                found.setdefault(path, set()).add(group)
        return found


@dataclass(frozen=True)
class Written:
    """The files a task wrote for its subtask's state."""

    run: tuple[str, int, tuple[int, ...]] | None = None
    """The round's change run: path, bytes, the key groups it holds."""
    merged: tuple[str, int, tuple[int, ...]] | None = None
    bases: dict[int, int] = field(default_factory=dict)
    """Key group -> bytes of its new base."""

    @property
    def bytes(self) -> int:
        return (
            (self.run[1] if self.run else 0)
            + (self.merged[1] if self.merged else 0)
            + sum(self.bases.values())
        )


_CACHE: OrderedDict[str, tuple[Run, int]] = OrderedDict()
_CACHE_BYTES = 0
DOWNLOADED = [0, 0]
"""Files and bytes this worker read from an object store (what local copies spare)."""


def load(
    paths: Mapping[str, int | None],
    declared: Mapping[str, StateDescriptor],
    local_dir: str | None = None,
    budget: int = CACHE_BYTES,
) -> dict[str, Run]:
    """Path -> its run; ``paths`` maps a legacy base's path to its key group (None: a run or a
    base of this format). A file on local disk, or with a local copy in ``local_dir``, is
    memory-mapped; the others are read together (`read_files`) and, with a ``local_dir``, kept
    there and mapped. Only what is held in memory counts toward ``budget``."""
    found: dict[str, Run] = {}
    missing: dict[str, int | None] = {}
    for path, legacy_group in paths.items():
        entry = _CACHE.get(path)
        if entry is None:
            missing[path] = legacy_group
        else:
            _CACHE.move_to_end(path)
            found[path] = entry[0]
    mapped: dict[str, str] = {}
    for path, legacy_group in missing.items():
        span = split_segment(path)
        on_disk = local_path(path if span is None else span[0])
        if span is not None and on_disk is not None and legacy_group is None:
            found[path] = changelog.decode_run(mapped_segment(on_disk, span[1], span[2]))
            remember(path, found[path], 0, budget)
            continue
        if on_disk is None and local_dir is not None:
            on_disk = local.cached(local_dir, path)
        if legacy_group is None and on_disk is not None and os.path.exists(on_disk):
            mapped[path] = on_disk
    remote = [p for p in missing if p not in mapped and p not in found]
    for path, data in read_files(remote).items():
        DOWNLOADED[0] += 1
        DOWNLOADED[1] += len(data)
        legacy_group = missing[path]
        if legacy_group is not None:
            run = changelog.from_legacy(decode_state(data, declared), legacy_group)
            remember(path, run, len(data), budget)
            found[path] = run
        elif local_dir is not None:
            mapped[path] = keep_local(local_dir, path, data)
        else:
            run = changelog.decode_run(data)
            remember(path, run, len(data), budget)
            found[path] = run
    for path, on_disk in mapped.items():
        run = changelog.decode_run(pa.memory_map(on_disk).read_buffer())
        remember(path, run, 0, budget)
        found[path] = run
    return found


def mapped_segment(on_disk: str, offset: int, length: int) -> pa.Buffer:
    """Bytes ``offset`` .. ``offset + length`` of a local merged file, memory-mapped."""
    source = pa.memory_map(on_disk)
    source.seek(offset)
    return source.read_buffer(length)


def keep_local(local_dir: str, path: str, data: bytes) -> str:
    """``data`` (the file at ``path``) kept in ``local_dir``; where it lies there."""
    on_disk = local.cached(local_dir, path)
    write_file(on_disk, data)  # a local path: written under a temporary name, renamed
    return on_disk


def remember(path: str, run: Run, size: int, budget: int = CACHE_BYTES) -> None:
    """``run`` kept in the worker's cache; ``size``: the bytes it holds in memory (0 for a
    memory-mapped file, whose pages are the kernel's to drop). The oldest entries go while the
    cache holds more than ``budget`` bytes or `CACHE_FILES` files."""
    global _CACHE_BYTES
    old = _CACHE.pop(path, None)
    if old is not None:
        _CACHE_BYTES -= old[1]
    _CACHE[path] = (run, size)
    _CACHE_BYTES += size
    while len(_CACHE) > CACHE_FILES or (budget < _CACHE_BYTES and len(_CACHE) > 1):
        _, (_, dropped) = _CACHE.popitem(last=False)
        _CACHE_BYTES -= dropped
    if budget < _CACHE_BYTES:  # one entry larger than the budget: not kept either
        _CACHE.clear()
        _CACHE_BYTES = 0


def cache_bytes() -> int:
    return _CACHE_BYTES


def write(path: str, run: Run, local_dir: str | None = None, budget: int = CACHE_BYTES) -> int:
    """Writes ``run`` at ``path``; returns its bytes. Later rounds in this worker find it without
    reading it back: on local disk (or kept in ``local_dir``) memory-mapped, else held in memory
    (counting toward ``budget``)."""
    data = changelog.encode_run(run)
    on_disk = local_path(path)
    if on_disk is None and local_dir is not None:
        on_disk = keep_local(local_dir, path, data)
    write_file(path, data)
    if on_disk is None:
        remember(path, run, len(data), budget)
    else:
        remember(path, changelog.decode_run(pa.memory_map(on_disk).read_buffer()), 0, budget)
    return len(data)


def fold(state: SubtaskState, declared: Mapping[str, StateDescriptor]) -> dict[int, int]:
    """A canonical savepoint's part, in a Spark task: each key group ``state.materialize`` names
    folded into one base at its ``base_paths`` entry; key group -> bytes written. The folded
    bases bypass the worker's cache (a savepoint's files are not read again here), and each
    key group's base leaves memory once folded: the task holds one key group's state at a
    time, beside the runs it shares with others."""
    view = StateView(state, declared)
    written = {}
    for group in state.materialize:
        data = changelog.encode_run(view.folded(group, expire_at=int(time.time() * 1000)))
        write_file(state.base_paths[group], data)
        written[group] = len(data)
        view.forget(state.chains[group][0])
    return written


class StateView:
    """A subtask's state for one round: lookups through its runs and bases."""

    def __init__(self, state: SubtaskState, declared: Mapping[str, StateDescriptor]):
        self.state = state
        self.declared = declared
        self.live = state.live()
        self._runs: dict[str, Run] = {}

    def _load(self, groups: set[int]) -> tuple[list[tuple[Run, set[int]]], list[Run]]:
        chains = {g: self.state.chains[g] for g in groups if g in self.state.chains}
        wanted: dict[str, int | None] = {}
        for group, (base, runs) in chains.items():
            if base is not None:
                wanted[base] = group if base in self.state.legacy else None
            wanted.update(dict.fromkeys(runs))
        missing = {p: g for p, g in wanted.items() if p not in self._runs}
        state = self.state
        self._runs.update(load(missing, self.declared, state.local_dir, state.memory_bytes))
        run_paths = sorted(
            {p for _, runs in chains.values() for p in runs}, key=lambda p: -self.state.seqs[p]
        )
        layers = [(self._runs[p], self.live[p]) for p in run_paths]
        bases = [self._runs[b] for b, _ in chains.values() if b is not None]
        return layers, bases

    def write(self, path: str, run: Run) -> int:
        """A file of this subtask's state written (`write`); its bytes."""
        return write(path, run, self.state.local_dir, self.state.memory_bytes)

    def forget(self, path: str | None) -> None:
        """A file no later lookup of this view reads (a key group's base, once folded)."""
        if path is not None:
            self._runs.pop(path, None)

    def lookup(self, keys: np.ndarray, groups: np.ndarray) -> dict[str, pd.Series]:
        runs, bases = self._load({int(g) for g in np.unique(groups)})
        return changelog.lookup(runs, bases, keys, groups, self.declared)

    def everything(self) -> tuple[np.ndarray, np.ndarray]:
        """Every key the subtask has state for, and its key group."""
        keys: list[np.ndarray] = []
        groups: list[np.ndarray] = []
        for group in sorted(self.state.chains):
            base = self.folded(group)
            for table in base.rows.values():
                found = table.column("key").to_numpy(zero_copy_only=False)
                keys.append(np.asarray(found, dtype=object))
                groups.append(np.full(len(found), group, dtype=np.int64))
        if not keys:
            return np.array([], dtype=object), np.array([], dtype=np.int64)
        all_keys = np.concatenate(keys)
        _, first = np.unique(all_keys, return_index=True)
        return all_keys[first], np.concatenate(groups)[first]

    def folded(
        self,
        group: int,
        newest: Run | None = None,
        only: str | None = None,
        expire_at: int | None = None,
    ) -> Run:
        """Key group ``group``'s whole state as a base (``newest``: a run written after the
        ones the books name; ``only``: of that one state; ``expire_at``: without the entries
        whose TTL ran out by then, ms, for a base that is written)."""
        runs, bases = self._load({group})
        layers = ([newest] if newest is not None else []) + [
            run for run, live in runs if group in live
        ]
        base = changelog.materialize([*layers, *bases], group, only)
        if expire_at is not None:
            base = changelog.without_expired(base, self.declared, expire_at)
        return base

    def folded_groups(self, groups: Collection[int], only: str | None = None) -> Run:
        """Key groups ``groups``' whole state as one base, folded together (`folded` of each,
        in one call: `changelog.materialize_groups`)."""
        wanted = {g for g in groups if g in self.state.chains}
        runs, _ = self._load(wanted)
        layers: list[tuple[Run, Collection[int]]] = [(run, live & wanted) for run, live in runs]
        bases: dict[str, set[int]] = {}
        for group in wanted:
            base = self.state.chains[group][0]
            if base is not None:
                bases.setdefault(base, set()).add(group)
        layers += [(self._runs[path], held) for path, held in bases.items()]
        return changelog.materialize_groups(layers, only)

    def compact(self, run: Run | None, written: Written, now_ms: int) -> Written:
        """``written`` (the round's ``run``, written) with the merge and the bases the driver
        asked for (without the entries whose TTL ran out by ``now_ms``)."""
        state = self.state
        merged = None
        if state.merge:
            self._load({g for p in state.merge for g in self.live[p]})
            parts = [(self._runs[p], self.live[p]) for p in state.merge]
            merged_run = changelog.merge_runs(parts)
            size = self.write(state.merge_path, merged_run)
            merged = (state.merge_path, size, tuple(sorted(merged_run.groups())))
        run_groups = written.run[2] if written.run is not None else ()
        bases: dict[int, int] = {}
        for group in state.materialize:
            newest = run if group in run_groups else None
            folded = self.folded(group, newest, expire_at=now_ms)
            bases[group] = self.write(state.base_paths[group], folded)
        return Written(written.run, merged, bases)
