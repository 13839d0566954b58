"""Channel state: the records an unaligned snapshot carries, written and read back (Flink's
``ChannelStateWriter`` and its rescaling of channel state on restore).

A keyed subtask's channel state is the run of segment files between its last completed state
and the checkpoint's barrier, in order. Segment files are immutable, so a snapshot does not
rewrite them: each is hard-linked into the checkpoint's directory where channel and checkpoint
storage share a local file system (no bytes move), and copied otherwise. A manifest per subtask,
``channel-<i>.json``, lists them in order with their rows and the key groups the subtask owned,
and the subtask's watermark at the snapshot (before these records; since event time):

    {"format": 1, "key_groups": [0, 63], "watermark": 1700000000000,
     "segments": [{"file": "channel-0000-00000.arrow", "rows": 812, "bytes": 50123,
                   "key_groups": [0, 63], "exact": true}, ...]}

A segment's ``key_groups`` are those whose rows in the file are this subtask's; ``exact``: the
file holds no other rows. Files a snapshot of an older version wrote may lack ``exact`` (a
restore with another parallelism linked whole files then): a restore reads them as inexact.
On restore, each new subtask takes, in the old subtasks' order, the files whose key groups
overlap its own and keeps only the rows of the overlap (segments carry each row's key group),
as `recovery` describes. Channel state is processed before any new input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.agent.rounds.channels import Segment
from sparkpoint.agent.state.backend import link_or_copy_all, read_file, write_file
from sparkpoint.common.events import StateHandle, StateHandleKind
from sparkpoint.common.keygroups import KeyGroupRange

MANIFEST_FORMAT = 1


def manifest_name(subtask: int) -> str:
    return f"channel-{subtask:04d}.json"


def persist(
    segments: list[Segment],
    channel_dir: str,
    target_location: str,
    subtask: int,
    key_groups: tuple[int, int],
    watermark: int | None = None,
) -> tuple[list[StateHandle], int]:
    """Writes one subtask's channel state into a checkpoint directory: its segments (linked or
    copied) and its manifest. Returns the state handles (manifest first) and the bytes of
    in-flight records persisted."""
    entries = []
    handles = []
    copies = []
    for k, segment in enumerate(segments):
        name = f"channel-{subtask:04d}-{k:05d}.arrow"
        copies.append((f"{channel_dir}/{segment.path}", f"{target_location}/{name}"))
        groups = segment.key_groups or key_groups
        entries.append({
            "file": name, "rows": segment.rows, "bytes": segment.size,
            "key_groups": list(groups), "exact": segment.exact,
        })  # fmt: skip
        path = f"{target_location}/{name}"
        handles.append(StateHandle(path, StateHandleKind.CHANNEL_STATE, segment.size, *groups))
    link_or_copy_all(copies)  # the segments first: a manifest never names a missing file
    body: dict[str, object] = {
        "format": MANIFEST_FORMAT, "key_groups": list(key_groups), "segments": entries,
    }  # fmt: skip
    if watermark is not None:
        body["watermark"] = watermark
    manifest = json.dumps(body).encode()
    path = f"{target_location}/{manifest_name(subtask)}"
    write_file(path, manifest)
    handle = StateHandle(path, StateHandleKind.CHANNEL_STATE, len(manifest), *key_groups)
    return [handle, *handles], sum(s.size for s in segments)


@dataclass(frozen=True)
class ChannelStateFile:
    """One segment of a restored snapshot's channel state."""

    old_subtask: int
    order: int
    path: str
    rows: int
    size: int
    key_groups: tuple[int, int]
    exact: bool = False
    """Every row lies within ``key_groups`` (recorded since FLIP-547 support; a file of an
    older snapshot may also hold rows of other subtasks, and is split before it is queued)."""


def read_manifest(path: str, old_subtask: int) -> list[ChannelStateFile]:
    """The segments a ``channel-<i>.json`` lists, as paths beside it."""
    return read_manifest_data(path, json.loads(read_file(path)), old_subtask)


def manifest_watermark(data: dict[str, Any]) -> int | None:
    """The watermark a channel-state manifest records (None: written without event time)."""
    value = data.get("watermark")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"channel state watermark must be an integer, got {value!r}")
    return value


def read_manifest_data(path: str, data: dict[str, Any], old_subtask: int) -> list[ChannelStateFile]:
    if data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: unknown channel state format {data.get('format')!r}")
    directory = path.rsplit("/", 1)[0]
    start, end = data["key_groups"]
    files = []
    for k, entry in enumerate(data["segments"]):
        path = f"{directory}/{entry['file']}"
        rows, size = int(entry["rows"]), int(entry["bytes"])
        first, last = entry.get("key_groups", (start, end))
        exact = bool(entry.get("exact", False))
        files.append(
            ChannelStateFile(old_subtask, k, path, rows, size, (int(first), int(last)), exact)
        )
    return files


def assign(
    files: list[ChannelStateFile], ranges: Sequence[KeyGroupRange]
) -> dict[int, list[ChannelStateFile]]:
    """Each new subtask's share: the files of every old subtask whose key groups overlap its own,
    in the old subtasks' order and each one's file order."""
    ordered = sorted(files, key=lambda f: (f.old_subtask, f.order))
    out: dict[int, list[ChannelStateFile]] = {}
    for subtask, groups in enumerate(ranges):
        mine = [
            f for f in ordered if f.key_groups[0] <= groups.end and groups.start <= f.key_groups[1]
        ]
        if mine:
            out[subtask] = mine
    return out
