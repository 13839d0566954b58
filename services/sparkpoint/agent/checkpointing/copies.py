"""A keyed subtask's snapshot in its asynchronous phase (on the copier threads): its new state
files linked or copied into the checkpoint, its sink manifest, and, unaligned, its channel
state; and the copies of staged output that make a savepoint self-contained."""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from sparkpoint.agent.checkpointing.pending import Copied, Plan
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.rounds.channels import Segment, SegmentFiles
from sparkpoint.agent.state import local
from sparkpoint.agent.state.backend import (
    copy_file,
    delete_files,
    link_or_copy_all,
    read_file,
    read_files,
    split_segment,
    write_file,
)
from sparkpoint.agent.state.books import StateBackend, Upload
from sparkpoint.agent.state.runs import SubtaskState
from sparkpoint.common.events import StateHandle
from sparkpoint.common.keygroups import KeyGroupRange

Outputs = list[tuple[int, str]]


@dataclass(frozen=True)
class SubtaskCopy:
    """What a keyed subtask's asynchronous phase writes besides its state files."""

    subtask: int
    groups: KeyGroupRange
    manifest_path: str
    manifest: dict[str, list[str]]
    in_flight: list[Segment]
    target: str
    channel_dir: str
    watermark: int | None = None
    """The subtask's watermark at the snapshot (before its channel state)."""

    def write(self) -> tuple[list[StateHandle], int]:
        """The sink manifest and, unaligned, the channel state: its handles and bytes."""
        write_file(self.manifest_path, json.dumps(self.manifest).encode())
        if not self.in_flight:
            return [], 0
        groups = (self.groups.start, self.groups.end)
        return channel_state.persist(
            self.in_flight, self.channel_dir, self.target, self.subtask, groups, self.watermark
        )


def copy_snapshot(
    plan: Plan, rest: SubtaskCopy, backend: StateBackend, segment_files: SegmentFiles
) -> Copied:
    """The asynchronous phase of a subtask's snapshot: its new state files copied. What it
    pinned (state files, in-flight segments) is released."""
    try:
        whole: list[tuple[str, str]] = []
        merged: dict[str, list[tuple[int, str]]] = {}  # merged file -> (offset, source)
        for upload, source in plan:
            if source is None:
                continue
            span = split_segment(upload.path)
            if span is None:
                whole.append((source, upload.path))
            else:
                merged.setdefault(span[0], []).append((span[1], source))
        # immutable files: linked where storage allows, on an object store copied together
        link_or_copy_all(whole)
        write_merged(merged, backend.local_dir)
        backend.keep_local((source, u.path) for u, source in plan if source and u.shared)
        return Copied(plan, *rest.write())
    finally:
        backend.release(s for _, s in plan)
        segment_files.release(s.path for s in rest.in_flight)


def write_merged(merged: dict[str, list[tuple[int, str]]], local_dir: str | None) -> None:
    """File merging: each merged file written whole at once (one PUT on an object store) from
    the sources of its segments, in the order of their offsets. A source on an object store is
    read from its local copy where this machine has one."""
    for path, parts in merged.items():
        sources = [source for _, source in sorted(parts)]
        nearby = {s: local.cached(local_dir, s) for s in sources if local_dir is not None}
        on_disk = {s: p for s, p in nearby.items() if os.path.exists(p)}
        data = read_files(s for s in sources if s not in on_disk)
        data |= {s: read_file(p) for s, p in on_disk.items()}
        write_file(path, b"".join(data[s] for s in sources))


Fold = Callable[[SubtaskState], dict[int, int]]
"""Writes a subtask's key groups folded into bases (`runs.fold`, as a Spark task): their bytes."""


def fold_snapshot(
    state: SubtaskState, pinned: list[str], fold: Fold, rest: SubtaskCopy,
    backend: StateBackend, segment_files: SegmentFiles,
) -> Copied:  # fmt: skip
    """The asynchronous phase of a canonical savepoint's subtask: each key group's chain folded
    into one base in the savepoint's directory (Flink's canonical format: every key group whole,
    whatever the backend's files), written by a Spark task where the state lies."""
    try:
        sizes = fold(state)
        plan: Plan = [
            (Upload(g, g, state.base_paths[g], size, False, True), state.base_paths[g])
            for g, size in sorted(sizes.items())
        ]
        return Copied(plan, *rest.write())
    finally:
        backend.release(pinned)
        segment_files.release(s.path for s in rest.in_flight)


def self_contained(epochs: dict[int, Outputs], target: str) -> dict[int, Outputs]:
    """A savepoint keeps copies of the staged output it names (relative paths inside it), so it
    restores anywhere, even where this agent's working files are gone. Copied now: the
    committer may publish and delete the originals at any moment after this round. An epoch is
    kept whole or not at all, for every subtask at once: a file already gone means the
    committer published the epoch (it deletes only after publishing), and a restore must never
    see part of an epoch (its digest would not match what the sink published)."""
    kept: dict[int, Outputs] = {}
    for epoch, outputs in epochs.items():
        names = []
        try:
            for subtask, path in outputs:
                name = f"sink/{posixpath.basename(path)}"
                copy_file(path, f"{target}/{name}")
                names.append((subtask, name))
        except FileNotFoundError:  # published meanwhile: the restore needs none of it
            delete_files([f"{target}/{name}" for _, name in names])
            continue
        kept[epoch] = names
    return kept
