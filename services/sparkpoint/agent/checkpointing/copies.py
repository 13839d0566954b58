"""A keyed subtask's snapshot in its asynchronous phase (on the copier threads): its new state
files linked or copied into the checkpoint, its sink manifest, and, unaligned, its channel
state; and the copies of staged output that make a savepoint self-contained."""

from __future__ import annotations

import json
import posixpath

from sparkpoint.agent.checkpointing.pending import Plan
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.rounds.channels import Segment, SegmentFiles
from sparkpoint.agent.state.backend import copy_file, delete_files, link_or_copy_all, write_file
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.common.events import StateHandle
from sparkpoint.common.keygroups import KeyGroupRange

Outputs = list[tuple[int, str]]


def copy_snapshot(
    plan: Plan, manifest_path: str, manifest: dict[str, list[str]], groups: KeyGroupRange,
    in_flight: list[Segment], target: str, subtask: int, channel_dir: str,
    backend: StateBackend, segment_files: SegmentFiles,
) -> tuple[list[StateHandle], int]:  # fmt: skip
    """The asynchronous phase of subtask ``subtask``'s snapshot; returns its channel-state
    handles and their bytes. What it pinned (state files, in-flight segments) is released."""
    try:
        # immutable files: linked where storage allows, on an object store copied together
        link_or_copy_all((source, upload.path) for upload, source in plan if source)
        write_file(manifest_path, json.dumps(manifest).encode())
        if not in_flight:
            return [], 0
        return channel_state.persist(
            in_flight, channel_dir, target, subtask, (groups.start, groups.end)
        )
    finally:
        backend.release(s for _, s in plan)
        segment_files.release(s.path for s in in_flight)


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
