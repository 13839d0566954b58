"""Reading a completed checkpoint or savepoint back: which file holds each key group's state,
where each source partition stood, and which sink epochs were staged but maybe not published.

A checkpoint is a directory with ``_metadata`` (written last by the coordinator); ``latest``
means the highest checkpoint id under ``<checkpoint-dir>/<job-id>/``. Key groups map to files
whatever the parallelism was: a restore with another parallelism hands whole key groups to their
new subtasks (Flink's KeyGroupRangeAssignment), and never filters state.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from dataclasses import dataclass, field

from fsspec.core import url_to_fs

from services.agent.state import read_file
from services.common.events import StateHandleKind

log = logging.getLogger(__name__)

CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")


class NoCheckpoint(FileNotFoundError):
    """There is no completed checkpoint to restore."""


@dataclass
class Restored:
    checkpoint_id: int
    external_path: str
    is_savepoint: bool
    key_groups: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Key group -> (file, size)."""
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    epochs: dict[int, list[str]] = field(default_factory=dict)
    """Sink epochs the snapshot staged, epoch -> staged output files, not yet known published."""
    shared: bool = False
    """The key-group files are shared copies of this job's incremental checkpoints."""


def _protocol_prefix(url: str) -> str:
    return url.split("://", 1)[0] + "://" if "://" in url else ""


def latest_checkpoint(checkpoint_dir: str, job_id: str) -> str:
    """The directory of the newest completed checkpoint of a job."""
    base = posixpath.join(checkpoint_dir.rstrip("/"), job_id)
    fs, root = url_to_fs(base)
    candidates: list[tuple[int, str]] = []
    if fs.exists(root):
        for entry in fs.ls(root, detail=False):
            name = posixpath.basename(str(entry).rstrip("/"))
            match = CHECKPOINT_DIR.match(name)
            if match and fs.exists(posixpath.join(str(entry), "_metadata")):
                candidates.append((int(match.group(1)), str(entry)))
    if not candidates:
        raise NoCheckpoint(f"no completed checkpoint of job {job_id} under {base}")
    return _protocol_prefix(base) + max(candidates)[1]


def load(path: str, job_id: str, checkpoint_dir: str) -> Restored:
    """A checkpoint or savepoint directory (or its ``_metadata`` file)."""
    directory = path[: -len("/_metadata")] if path.endswith("/_metadata") else path.rstrip("/")
    try:
        metadata = json.loads(read_file(f"{directory}/_metadata"))
    except FileNotFoundError as exc:
        raise NoCheckpoint(f"{directory} has no _metadata: not a completed checkpoint") from exc
    if metadata.get("job_id") not in (job_id, None):
        log.warning("restoring job %s from a snapshot of job %s", job_id, metadata.get("job_id"))
    restored = Restored(
        int(metadata["checkpoint_id"]),
        directory,
        str(metadata.get("snapshot_type", "CHECKPOINT")).startswith("SAVEPOINT"),
    )
    shared_prefix = posixpath.join(checkpoint_dir.rstrip("/"), job_id, "shared") + "/"
    all_shared = True
    for subtask in metadata["subtasks"]:
        for handle in subtask["state_handles"]:
            kind = StateHandleKind[handle["kind"]]
            if kind is StateHandleKind.KEYED_STATE:
                start, end = handle["key_groups"]
                for group in range(int(start), int(end) + 1):
                    restored.key_groups[group] = (handle["path"], int(handle["size"]))
                all_shared &= handle["path"].startswith(shared_prefix)
            elif kind is StateHandleKind.SOURCE_POSITIONS:
                positions = json.loads(read_file(handle["path"]))
                for topic, offsets in positions.items():
                    for partition, offset in offsets.items():
                        restored.positions[(topic, int(partition))] = int(offset)
            elif kind is StateHandleKind.SINK_EPOCH:
                manifest = json.loads(read_file(handle["path"]))
                for epoch, outputs in manifest.items():
                    restored.epochs.setdefault(int(epoch), []).extend(outputs)
    restored.shared = bool(restored.key_groups) and all_shared and not restored.is_savepoint
    for outputs in restored.epochs.values():
        outputs.sort()
    return restored
