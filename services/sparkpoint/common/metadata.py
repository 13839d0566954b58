"""The ``_metadata`` file of a completed checkpoint or savepoint, in one place: the coordinator
writes it last and atomically when every subtask acknowledged, restores read it, and the REST
API lists savepoints by it.

It is JSON: the job id, the checkpoint id, the snapshot type, when it was triggered, the job's
parallelism and max parallelism, and per subtask its state size and state handles (path, kind,
size, whether shared, the key-group range).

**Relocatable.** A file inside the snapshot's own directory is written as a path relative to it
(``kg-00003-....arrow``); anything else (a checkpoint's ``shared/`` copies, staged sink output) as
the absolute path or URL it has. A reader resolves relative paths against the directory it read
``_metadata`` from, so a savepoint (every file of which is inside its directory) can be moved or
copied to another directory or storage URL and restored from there. Files written before this
format (version 1) carry absolute paths only and read as before.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    SavepointFormat,
    SnapshotType,
    StateHandleKind,
)
from sparkpoint.common.paths import canonical

FORMAT_VERSION = 2
SEGMENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
"""What the state file of a segment of a merged file may be called (no directory, no ``#``)."""
NAME = "_metadata"


class BadMetadata(ValueError):
    """A ``_metadata`` file that is not one sparkpoint wrote; the message says what is off."""


@dataclass(frozen=True)
class Handle:
    path: str
    """Absolute path or URL (resolved against the snapshot's directory when read)."""
    kind: StateHandleKind
    size: int
    shared: bool = False
    key_groups: tuple[int, int] | None = None
    offset: int | None = None
    """A segment of a merged file (file merging): bytes offset .. offset + size of ``path``."""
    segment: str | None = None
    """The name of the state file the segment holds."""


@dataclass(frozen=True)
class SubtaskState:
    subtask_id: str
    state_size: int
    handles: tuple[Handle, ...] = ()


@dataclass(frozen=True)
class SnapshotMetadata:
    job_id: str
    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    subtasks: tuple[SubtaskState, ...] = ()
    parallelism: int | None = None
    max_parallelism: int | None = None
    format_type: SavepointFormat = SavepointFormat.CANONICAL
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type.is_savepoint

    @property
    def state_size(self) -> int:
        return sum(s.state_size for s in self.subtasks)

    def files(self) -> list[str]:
        return [h.path for s in self.subtasks for h in s.handles]

    @classmethod
    def from_acknowledgements(
        cls,
        job_id: str,
        checkpoint_id: int,
        snapshot_type: SnapshotType,
        trigger_ms: int,
        acknowledgements: tuple[AcknowledgeCheckpoint, ...] | list[AcknowledgeCheckpoint],
        parallelism: int | None = None,
        max_parallelism: int | None = None,
        format_type: SavepointFormat = SavepointFormat.CANONICAL,
    ) -> SnapshotMetadata:
        subtasks = tuple(
            SubtaskState(
                ack.subtask_id,
                ack.state_size_bytes,
                tuple(
                    Handle(
                        h.path, h.kind, h.size_bytes, h.shared,
                        None if h.key_group_start is None or h.key_group_end is None
                        else (h.key_group_start, h.key_group_end),
                        h.offset, h.segment,
                    )
                    for h in ack.state_handles
                ),
            )
            for ack in acknowledgements
        )  # fmt: skip
        return cls(
            job_id, checkpoint_id, snapshot_type, trigger_ms, subtasks, parallelism,
            max_parallelism, format_type,
        )  # fmt: skip

    # --- the file ----------------------------------------------------------------------------

    def to_json(self, location: str) -> bytes:
        """The file's bytes for a snapshot in ``location``: files inside it relative."""
        base = canonical(location).rstrip("/") + "/"

        def written(path: str) -> str:
            absolute = canonical(path)
            return absolute[len(base) :] if absolute.startswith(base) else absolute

        document = {
            "format_version": FORMAT_VERSION,
            "job_id": self.job_id,
            "checkpoint_id": self.checkpoint_id,
            "snapshot_type": self.snapshot_type.name,
            "format_type": self.format_type.name,
            "trigger_timestamp": self.trigger_ms,
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "subtasks": [
                {
                    "subtask_id": s.subtask_id,
                    "state_size": s.state_size,
                    "state_handles": [
                        {
                            "path": written(h.path),
                            "kind": h.kind.name,
                            "size": h.size,
                            "shared": h.shared,
                            "key_groups": list(h.key_groups) if h.key_groups else [None, None],
                        }
                        | (
                            {"offset": h.offset, "segment": h.segment}
                            if h.offset is not None
                            else {}
                        )
                        for h in s.handles
                    ],
                }
                for s in self.subtasks
            ],
            **self.extra,
        }
        # compact: json's C encoder serves only documents without indentation, and the
        # coordinator writes one per completed checkpoint (indent=1 cost a fifth of its CPU at
        # 1,000 checkpoints a second)
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str, location: str) -> SnapshotMetadata:
        """Reads a ``_metadata`` found in ``location``; relative paths resolve against it."""
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise BadMetadata("not a JSON object")
            base = location.rstrip("/")
            subtasks = tuple(
                SubtaskState(
                    str(s["subtask_id"]),
                    int(s.get("state_size", 0)),
                    tuple(_handle(h, base) for h in s.get("state_handles", [])),
                )
                for s in document.get("subtasks", [])
            )
            return cls(
                str(document["job_id"]),
                int(document["checkpoint_id"]),
                SnapshotType[str(document.get("snapshot_type", "CHECKPOINT"))],
                int(document.get("trigger_timestamp") or 0),
                subtasks,
                _optional_int(document.get("parallelism")),
                _optional_int(document.get("max_parallelism")),
                SavepointFormat[str(document.get("format_type", "CANONICAL"))],
                int(document.get("format_version", 1)),
            )
        except BadMetadata:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise BadMetadata(f"{location}/{NAME} is not a sparkpoint snapshot: {exc!r}") from exc


def _handle(raw: dict[str, Any], base: str) -> Handle:
    path = str(raw["path"])
    if "://" not in path and not path.startswith("/"):
        path = posixpath.join(base, path)  # relative: inside the snapshot's directory
    groups = raw.get("key_groups")
    key_groups = (
        (int(groups[0]), int(groups[1]))
        if isinstance(groups, list) and len(groups) == 2 and None not in groups
        else None
    )
    offset = raw.get("offset")
    segment = raw.get("segment")
    if offset is not None and not (
        int(offset) >= 0 and isinstance(segment, str) and SEGMENT_NAME.fullmatch(segment)
    ):
        raise ValueError(f"handle {path}: a segment needs an offset >= 0 and a plain file name")
    return Handle(
        path, StateHandleKind[str(raw["kind"])], int(raw.get("size", 0)),
        bool(raw.get("shared", False)), key_groups,
        None if offset is None else int(offset),
        None if offset is None else segment,
    )  # fmt: skip


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
