"""The driver's books of keyed state: which files hold each key group's state, which of them a
checkpoint already has copies of, when they are compacted, and which working files may go.

A key group's state is a **chain** (state/changelog.py): a base (its whole state as of some round,
or none) and the runs of changes written since, newest first. A round writes one change run per
subtask, holding the key groups its records touched; the run joins the chain of each of them.
Files are immutable and named by the round they hold changes up to (``seq``), which orders runs
of different key groups, also across restores (a restored job's rounds continue after the
newest ``seq`` it restored).

Compaction, asked of a round's tasks (`StateBackend.compaction`):

- a **merge**: once a subtask has `FAN_IN` runs of one level in a row (a round's run is level 0),
  they become one run of the next level, so a lookup reads a few runs however many rounds changed
  its keys. Merges are local, as RocksDB's compactions are under Flink's changelog backend: a
  chain keeps two views, ``runs`` (what lookups read, merges in place of their parts) and
  ``log`` (every round's run since the base, what a checkpoint names), so a checkpoint uploads
  each change once;
- a **materialization**: a key group whose base is older than the materialization interval
  (Flink's ``state.changelog.periodic-materialize.interval``) gets a new base, and both views
  end there. Key groups start at staggered points of the interval, so about the same share of
  the state is folded every round.

Ownership follows Flink's split between task-owned and shared state: working files belong to
the agent, which deletes one once no chain names it and no snapshot copies from it; checkpointed
copies belong to the coordinator, which counts references and deletes a copy when no retained
checkpoint needs it. An incremental checkpoint copies the files written since the last
*completed* checkpoint and references the copies it made before; a full checkpoint or a savepoint
copies every file into its own directory. With file merging (FLIP-306, `copy_paths`), a
snapshot's new copies of one subtask are segments of one merged file; the coordinator counts the
merged file, which goes when no retained checkpoint names any of its segments.
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Container, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sparkpoint.agent.state import local
from sparkpoint.agent.state.backend import (
    delete_files,
    link_or_copy_all,
    read_file,
    segment,
    split_segment,
    write_file,
)
from sparkpoint.agent.state.runs import CACHE_BYTES, SubtaskState, Written
from sparkpoint.agent.time.timers import TimerIndex

FAN_IN = 8
"""Runs of one level that merge into one of the next."""
MATERIALIZE_INTERVAL_S = 600.0
"""Flink's default ``state.changelog.periodic-materialize.interval``."""
MATERIALIZE_SHARE = 16
"""A subtask materializes at most 1/16 of its key groups (at least one) per round."""
RESTORED_RUNS = 4 * FAN_IN
"""More runs than this (a restored log) merge into one in the next round."""
GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class StateFile:
    """One immutable file of keyed state: a base of one key group, a run of changes to the key
    groups ``first..last`` (those it holds rows of), or a base in the earlier format
    (``legacy``: one key group's whole state, from an older checkpoint)."""

    path: str
    size: int
    seq: int
    first: int
    last: int
    kind: str = "run"
    level: int = 0
    owned: bool = True
    """A working file the agent may delete; restored files never are."""
    logged: bool = True
    """In the log of every chain whose runs name it (a round's run, a restored run); false for
    a run a merge here wrote, which only ``runs`` names."""

    def copy_name(self) -> str:
        """The name of a checkpointed copy, from which a restore reads what the file is."""
        tag = uuid.uuid4().hex
        if self.kind == "run":
            return f"run-{self.first:05d}-{self.last:05d}-{self.seq:012d}-l{self.level}-{tag}.arrow"
        if self.kind == "base":
            return f"base-{self.first:05d}-{self.seq:012d}-{tag}.arrow"
        return f"kg-{self.first:05d}-{tag}.arrow"


_COPY = re.compile(
    r"^(?:run-(?P<first>\d+)-(?P<last>\d+)-(?P<seq>\d+)-l(?P<level>\d+)"
    r"|base-(?P<group>\d+)-(?P<base_seq>\d+))-[0-9a-f]+\.arrow$"
)


def file_name(locator: str) -> str:
    """The name of the state file at a path or in a `segment` of a merged file."""
    found = split_segment(locator)
    return posixpath.basename(locator) if found is None else found[3]


def restored_file(path: str, size: int, first: int, last: int) -> StateFile:
    """A state file a checkpoint names, as its name describes it; any other name is a key
    group's file of the earlier format (``kg-<group>-<tag>.arrow``)."""
    found = _COPY.match(posixpath.basename(path))
    if found is None:
        return StateFile(path, size, -1, first, last, "legacy", owned=False)
    if found["group"] is not None:
        return StateFile(path, size, int(found["base_seq"]), first, last, "base", owned=False)
    return StateFile(
        path, size, int(found["seq"]), first, last, "run", int(found["level"]), owned=False
    )


@dataclass(frozen=True)
class Chain:
    """A key group's state: its base, and the runs written since, newest first, in two views.
    ``runs`` is what lookups read: merged runs in place of their parts. ``log`` is what a
    checkpoint names and a restore reads: every round's run since the base, as the round wrote
    it (Flink's changelog: merges are local, so a checkpoint uploads a change once)."""

    base: StateFile | None = None
    runs: tuple[StateFile, ...] = ()
    log: tuple[StateFile, ...] = ()

    def files(self) -> list[StateFile]:
        """What lookups read."""
        return [*self.runs, *([self.base] if self.base is not None else [])]

    def durable(self) -> list[StateFile]:
        """What a checkpoint names."""
        return [*self.log, *([self.base] if self.base is not None else [])]


class Prepended:
    """A run put ahead of many key groups' runs and logs: key groups that had one tuple get one
    tuple (a round touches many key groups, mostly with the same log), so a log is kept once
    however many key groups share it and a checkpoint's plan reads each once."""

    def __init__(self, run: StateFile) -> None:
        self.run = run
        self._made: dict[int, tuple[tuple[StateFile, ...], tuple[StateFile, ...]]] = {}
        """id of a tuple -> (that tuple, kept alive so the id stays its own, the new one)."""

    def of(self, files: tuple[StateFile, ...]) -> tuple[StateFile, ...]:
        made = self._made.get(id(files))
        if made is None:
            made = self._made[id(files)] = (files, (self.run, *files))
        return made[1]


def without(chain: Chain, merged: Container[str]) -> tuple[list[StateFile], list[StateFile]]:
    """A merge's parts taken out of ``chain``'s runs: (the runs kept, the parts the chain no
    longer names at all: those its log does not name either)."""
    kept = [r for r in chain.runs if r.path not in merged]
    gone = [r for r in chain.runs if r.path in merged and not r.logged]
    return kept, gone


def read_state(chains: dict[int, Chain], **fields: Any) -> SubtaskState:
    """What a task is told of ``chains`` to read them (paths only), with the other ``fields`` of
    `SubtaskState` (the compaction it is to do, where local copies go, its memory budget)."""
    return SubtaskState(
        chains={
            g: (c.base.path if c.base else None, tuple(r.path for r in c.runs))
            for g, c in chains.items()
        },
        seqs={r.path: r.seq for c in chains.values() for r in c.runs},
        legacy=frozenset(
            c.base.path for c in chains.values() if c.base and c.base.kind == "legacy"
        ),
        **fields,
    )


@dataclass(frozen=True)
class Upload:
    """A state file as a snapshot references it."""

    first: int
    last: int
    path: str
    size: int
    shared: bool
    new: bool
    """Copied for this snapshot (false: a copy an earlier checkpoint or subtask made, reused)."""


@dataclass
class StateBackend:
    """Each key group's chain, the copies completed checkpoints made, and the working files
    that may go."""

    state_dir: str
    chains: dict[int, Chain] = field(default_factory=dict)
    seq_offset: int = 0
    """Added to a round's number to make its ``seq``: past every restored file's."""
    materialize_interval_s: float = MATERIALIZE_INTERVAL_S
    memory_bytes: int = CACHE_BYTES
    """A worker's budget for state held in memory (``state.backend.memory.fixed-per-slot``); a
    merge reads its runs whole, so runs larger together stay apart (the lookups read one more
    file each) until their key groups are materialized."""
    local_dir: str | None = None
    """Where tasks keep local copies of files on an object store (state/local.py)."""
    local_backup: bool = False
    """``execution.checkpointing.local-backup.enabled``: checkpoint copies kept locally too."""
    merged_file_bytes: int | None = None
    """File merging (``execution.checkpointing.file-merging.*``): a snapshot's new copies of one
    subtask go into merged files of at most this many bytes, each copy a `segment` of one;
    None: a file per copy."""
    confirmed: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Working file -> (its shared copy, size) as of the last completed checkpoint."""
    materialized: dict[int, float] = field(default_factory=dict)
    """Key group -> when its base was written or restored (monotonic seconds)."""
    _proposed: dict[int, dict[str, tuple[str, int, bool]]] = field(default_factory=dict)
    """Checkpoint -> working file -> (its copy, size, shared) made for it."""
    _refs: Counter[str] = field(default_factory=Counter)
    _pins: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _garbage: list[str] = field(default_factory=list)
    timers: TimerIndex = field(default_factory=TimerIndex)
    """Where event-time timers may be due (time/timers.py): kept with the chains they index."""
    processing_timers: TimerIndex = field(default_factory=TimerIndex)
    """Where processing-time timers may be due."""

    # --- what a round's task is told, and what it wrote -------------------------------------

    def stagger(self, group: int) -> float:
        """How far into the interval key group ``group`` starts: spread evenly, so that about
        the same share of the state is materialized every round, not all of it at once."""
        return self.materialize_interval_s * ((group * GOLDEN) % 1.0)

    def seq(self, round_number: int) -> int:
        return self.seq_offset + round_number

    def run_path(self, seq: int, subtask: int) -> str:
        return f"{self.state_dir}/runs/r{seq:012d}-s{subtask:04d}.arrow"

    def subtask_state(
        self, groups: Container[int], seq: int, subtask: int, now: float
    ) -> SubtaskState:
        """The key groups ``groups`` as a stage-2 task needs them, with the compaction this
        round does (`compaction`)."""
        with self._lock:
            chains = {g: c for g, c in self.chains.items() if g in groups}
        merge, materialize = self.compaction(chains, now)
        merge_path = ""
        if merge:
            level = max(f.level for f in merge) + 1
            merge_path = (
                f"{self.state_dir}/runs/m{merge[0].seq:012d}-l{level}-s{subtask:04d}-"
                f"{uuid.uuid4().hex[:8]}.arrow"
            )
        return read_state(
            chains,
            local_dir=self.local_dir,
            memory_bytes=self.memory_bytes,
            merge=tuple(f.path for f in merge),
            merge_path=merge_path,
            materialize=tuple(materialize),
            base_paths={g: f"{self.state_dir}/kg-{g:05d}/b{seq:012d}.arrow" for g in materialize},
        )

    def compaction(self, chains: dict[int, Chain], now: float) -> tuple[list[StateFile], list[int]]:
        """The runs to merge (the newest `FAN_IN` or more in a row of one level, among the
        runs the subtask's chains name) and the key groups to materialize (those whose base is
        older than the interval, oldest first, a share per round)."""
        runs = sorted(
            {r.path: r for c in chains.values() for r in c.runs}.values(), key=lambda r: -r.seq
        )
        if len(runs) > RESTORED_RUNS:  # a restore's log: merged at once, not FAN_IN at a time
            total, end = 0, 0
            while end < len(runs) and total + runs[end].size <= self.memory_bytes:
                total, end = total + runs[end].size, end + 1
            if end >= 2:
                return runs[:end], []
        merge: list[StateFile] = []
        start = 0
        for i in range(1, len(runs) + 1):
            if i == len(runs) or runs[i].level != runs[start].level:
                if i - start >= FAN_IN and sum(r.size for r in runs[start:i]) <= self.memory_bytes:
                    merge = runs[start:i]
                    break
                start = i
        due = sorted(
            (self.materialized.get(g, 0.0), g)
            for g, c in chains.items()
            if c.runs and now - self.materialized.get(g, 0.0) >= self.materialize_interval_s
        )
        share = max(1, len(chains) // MATERIALIZE_SHARE)
        return merge, [g for _, g in due[:share]]

    def install(self, subtask_state: SubtaskState, written: Written, seq: int, now: float) -> None:
        """What a round's task wrote joins the books: a merged run replaces the runs it holds in
        every chain that named them, the round's run heads the chains of the key groups it
        holds, and a new base ends its key group's chain."""
        with self._lock:
            if written.merged is not None and not written.merged[2]:
                self._merged_into_nothing(
                    set(subtask_state.chains), set(subtask_state.merge), written.merged[0]
                )
            elif written.merged is not None:
                path, size, groups = written.merged
                merged_paths = set(subtask_state.merge)
                old = {
                    r.path: r
                    for g in groups
                    for r in self.chains.get(g, Chain()).runs
                    if r.path in merged_paths
                }.values()
                level = max((r.level for r in old), default=0) + 1
                newest = max((r.seq for r in old), default=seq)
                merged = StateFile(
                    path, size, newest, min(groups), max(groups), "run", level, logged=False
                )
                for group in groups:
                    chain = self.chains.get(group, Chain())
                    kept, gone = without(chain, merged_paths)
                    runs = sorted([*kept, merged], key=lambda r: -r.seq)
                    self._replace(group, Chain(chain.base, tuple(runs), chain.log), [merged], gone)
            if written.run is not None:
                path, size, groups = written.run
                run = StateFile(path, size, seq, min(groups), max(groups))
                ahead = Prepended(run)
                for group in groups:
                    chain = self.chains.get(group, Chain())
                    grown = Chain(chain.base, ahead.of(chain.runs), ahead.of(chain.log))
                    self._replace(group, grown, [run], [])
                    if group not in self.materialized:  # a new key group's first run
                        self.materialized[group] = now - self.stagger(group)
            for group, size in written.bases.items():
                path = subtask_state.base_paths[group]
                self._replace(group, Chain(StateFile(path, size, seq, group, group, "base")))
                self.materialized[group] = now

    def _merged_into_nothing(self, groups: set[int], merged_paths: set[str], path: str) -> None:
        """Under the lock: a merge whose runs held no row of a key group they are live for (a
        restored run spans key groups it has no rows of): they leave the chains that named
        them in the subtask's key groups, and the empty merged file is garbage."""
        for group in sorted(groups):
            chain = self.chains.get(group, Chain())
            if any(r.path in merged_paths for r in chain.runs):
                kept, gone = without(chain, merged_paths)
                self._replace(group, Chain(chain.base, tuple(kept), chain.log), [], gone)
        self._garbage.append(path)

    def _replace(
        self,
        group: int,
        chain: Chain,
        added: list[StateFile] | None = None,
        removed: list[StateFile] | None = None,
    ) -> None:
        """Under the lock: ``group``'s chain becomes ``chain``; files no chain names any more
        become garbage (unless a snapshot still copies them: `collect_garbage`). ``added`` and
        ``removed``: what the change adds to the chain and takes from it, when the caller knows
        (a round's run, a merge); else the two chains are compared, which costs their length
        (a log grows by a run a round until its key group is materialized: compared every
        round, the books took a driver's core after a few thousand rounds)."""
        if added is None or removed is None:
            old = self.chains.get(group, Chain())
            now = {f.path: f for f in [*chain.files(), *chain.log]}
            before = {f.path: f for f in [*old.files(), *old.log]}
            added = [f for p, f in now.items() if p not in before]
            removed = [f for p, f in before.items() if p not in now]
        for f in added:
            if f.owned:
                self._refs[f.path] += 1
        for f in removed:
            if f.owned:
                self._refs[f.path] -= 1
                if self._refs[f.path] <= 0:
                    del self._refs[f.path]
                    self._garbage.append(f.path)
        self.chains[group] = chain

    # --- snapshots ---------------------------------------------------------------------------

    def plan(
        self,
        checkpoint_id: int,
        groups: Container[int],
        incremental: bool,
        target: str,
        shared_dir: str,
    ) -> list[tuple[Upload, str | None]]:
        """What a snapshot of ``groups`` references, and for each new copy its source file
        (pinned until `release` is called). A file several subtasks' key groups share is copied
        once per checkpoint."""
        plan: list[tuple[Upload, str | None]] = []
        with self._lock:
            proposed = self._proposed.setdefault(checkpoint_id, {})
            files: dict[str, StateFile] = {}
            logs: set[int] = set()  # key groups a round touched together share one log
            for group, chain in self.chains.items():
                if group in groups:
                    if id(chain.log) not in logs:
                        logs.add(id(chain.log))
                        files.update((f.path, f) for f in chain.log)
                    if chain.base is not None:
                        files[chain.base.path] = chain.base
            new: list[StateFile] = []
            for path, f in sorted(files.items()):
                made = proposed.get(path)
                confirmed = self.confirmed.get(path) if incremental else None
                if made is None and confirmed is not None:
                    made = (*confirmed, True)
                if made is None:
                    new.append(f)
                    continue
                copy, size, shared = made
                plan.append((Upload(f.first, f.last, copy, size, shared, False), None))
                proposed[path] = made
            copies = self.copy_paths(new, shared_dir if incremental else target)
            for f in new:
                upload = Upload(f.first, f.last, copies[f.path], f.size, incremental, True)
                plan.append((upload, f.path))
                self._pins[f.path] += 1
                proposed[f.path] = (upload.path, f.size, incremental)
        return plan

    def copy_paths(self, files: list[StateFile], directory: str) -> dict[str, str]:
        """Where each of ``files`` is copied in ``directory``: a file of its own, or with file
        merging a `segment` of a merged file (filled in order up to `merged_file_bytes`; a
        larger file stays whole), which a snapshot's copy writes at once."""
        limit = self.merged_file_bytes
        paths: dict[str, str] = {}
        merged, offset = "", 0
        for f in files:
            name = f.copy_name()
            if limit is None or f.size > limit:
                paths[f.path] = f"{directory}/{name}"
                continue
            if not merged or offset + f.size > limit:
                merged, offset = f"{directory}/merged-{uuid.uuid4().hex}.arrows", 0
            paths[f.path] = segment(merged, offset, f.size, name)
            offset += f.size
        return paths

    def canonical(self, groups: Container[int], target: str) -> tuple[SubtaskState, list[str]]:
        """A canonical savepoint of ``groups``: each key group's chain to be folded into one base
        in ``target`` (`runs.fold`), and the files that reads, pinned until `release`d."""
        with self._lock:
            chains = {g: c for g, c in self.chains.items() if g in groups}
            pinned = sorted({f.path for c in chains.values() for f in c.files()})
            for path in pinned:
                self._pins[path] += 1
        paths = {}
        for group, chain in chains.items():
            # named by the newest change it holds (a legacy base has none: -1), as bases are
            seq = max(0, *(f.seq for f in chain.files()))
            paths[group] = f"{target}/{StateFile('', 0, seq, group, group, 'base').copy_name()}"
        state = read_state(
            chains,
            local_dir=self.local_dir,
            memory_bytes=self.memory_bytes,
            materialize=tuple(sorted(chains)),
            base_paths=paths,
        )
        return state, pinned

    def release(self, sources: Iterable[str | None]) -> None:
        with self._lock:
            for source in sources:
                if source is not None:
                    self._pins[source] -= 1
                    if self._pins[source] <= 0:
                        del self._pins[source]

    def complete(self, checkpoint_id: int, is_savepoint: bool) -> None:
        """Checkpoint ``checkpoint_id`` completed. Its shared copies become the base of later
        incremental checkpoints: the latest completed checkpoint is never subsumed, so they
        stay. After a full checkpoint there is no base (its copies go with its directory); a
        savepoint changes nothing (it is never the base of a checkpoint)."""
        with self._lock:
            proposed = self._proposed.pop(checkpoint_id, {})
            for old in [c for c in self._proposed if c < checkpoint_id]:
                del self._proposed[old]
            if is_savepoint:
                return
            before = {c for c, _ in self.confirmed.values()}
            self.confirmed = {p: (c, s) for p, (c, s, shared) in proposed.items() if shared}
        if self.local_dir is not None:  # local copies of the latest completed checkpoint only
            local.forget(self.local_dir, before - {c for c, _ in self.confirmed.values()})

    def keep_local(self, copies: Iterable[tuple[str, str]]) -> None:
        """With local backup, each (working file, its checkpoint copy) kept on this machine's
        disk under the copy's name too (a hard link), for a restart here to restore from."""
        if self.local_backup and self.local_dir is not None:
            for source, copy in copies:
                local.link(self.local_dir, source, copy)

    def abort(self, checkpoint_id: int) -> None:
        with self._lock:
            self._proposed.pop(checkpoint_id, None)

    def restore(self, files: Iterable[StateFile], shared: bool, now: float | None = None) -> None:
        """The state files of a checkpoint or savepoint become the chains. Shared copies of this
        job's incremental checkpoints count as confirmed; anything else is copied again by the
        next checkpoint (Flink's NO_CLAIM restore mode)."""
        files = list(files)
        when = time.monotonic() if now is None else now
        with self._lock:
            self.chains.clear()
            self.confirmed.clear()
            self._proposed.clear()
            bases: dict[int, StateFile] = {}
            for f in files:
                if f.kind != "run":
                    for group in range(f.first, f.last + 1):
                        bases[group] = f
            runs: dict[int, list[StateFile]] = {}
            for f in files:
                if f.kind == "run":
                    for group in range(f.first, f.last + 1):
                        base = bases.get(group)
                        if base is None or f.seq > base.seq:
                            runs.setdefault(group, []).append(f)
            for group in set(bases) | set(runs):
                chain_runs = tuple(sorted(runs.get(group, []), key=lambda r: -r.seq))
                self.chains[group] = Chain(bases.get(group), chain_runs, chain_runs)
                self.materialized[group] = when - self.stagger(group)
            self.seq_offset = max((f.seq for f in files), default=-1) + 1
            if shared:
                self.confirmed = {f.path: (f.path, f.size) for f in files}

    def adopt(self) -> int:
        """After a restore from files the job does not keep (`restore` with ``shared`` false:
        a NO_CLAIM snapshot, a savepoint, a full checkpoint whose directory goes with it once
        subsumed): every restored file becomes a working file of this agent, linked (one local
        file system) or copied, before any round reads it. From then on nothing the job does
        reads the snapshot, which may go as soon as the first checkpoint completed (Flink's
        NO_CLAIM); the first checkpoint copies the adopted files as it copies any working
        file. Returns the bytes adopted."""
        with self._lock:
            restored = {
                f.path: f for c in self.chains.values() for f in [*c.files(), *c.log] if not f.owned
            }
        targets = {path: f"{self.state_dir}/adopted/{file_name(path)}" for path in restored}
        whole = [(p, t) for p, t in targets.items() if split_segment(p) is None]
        link_or_copy_all(whole)
        for path, target in targets.items():  # a segment of a merged file: its bytes alone
            if split_segment(path) is not None:
                write_file(target, read_file(path))
        adopted = {p: replace(f, path=targets[p], owned=True) for p, f in restored.items()}
        with self._lock:
            for group, chain in list(self.chains.items()):
                self._replace(
                    group,
                    Chain(
                        adopted.get(chain.base.path, chain.base) if chain.base else None,
                        tuple(adopted.get(r.path, r) for r in chain.runs),
                        tuple(adopted.get(r.path, r) for r in chain.log),
                    ),
                )
        return sum(f.size for f in restored.values())

    # --- garbage -------------------------------------------------------------------------------

    @property
    def has_garbage(self) -> bool:
        """Whether replaced working files wait (a glance without the lock: `collect_garbage`
        decides under it)."""
        return bool(self._garbage)

    def collect_garbage(self) -> list[str]:
        """Working files no chain names and no snapshot in progress copies: deleted."""
        with self._lock:
            free = [p for p in self._garbage if p not in self._pins and p not in self._refs]
            self._garbage = [p for p in self._garbage if p in self._pins and p not in self._refs]
        delete_files(free)
        if self.local_dir is not None:
            local.forget(self.local_dir, free)
        return free

    @property
    def state_bytes(self) -> int:
        """Bytes of the files the chains name (each once)."""
        with self._lock:
            files = {f.path: f.size for c in self.chains.values() for f in c.files()}
        return sum(files.values())
