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
from dataclasses import dataclass, field
from typing import Any

from fsspec.core import url_to_fs

from sparkpoint.agent.recovery.channel_state import (
    ChannelStateFile,
    manifest_watermark,
    read_manifest_data,
)
from sparkpoint.agent.state.backend import job_dirs, physical, read_file, segment
from sparkpoint.agent.state.books import StateFile, restored_file
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import latest_store_record
from sparkpoint.common.events import CheckpointStoreRecord, StateHandleKind
from sparkpoint.common.keygroups import KeyGroupRange
from sparkpoint.common.metadata import BadMetadata, Handle, SnapshotMetadata
from sparkpoint.common.storage import CHECKPOINT_DIR

log = logging.getLogger(__name__)


class NoCheckpoint(FileNotFoundError):
    """There is no completed checkpoint to restore."""


@dataclass
class Restored:
    checkpoint_id: int
    external_path: str
    is_savepoint: bool
    state_files: dict[str, StateFile] = field(default_factory=dict)
    """Keyed state: path -> what the file is (a base, a run of changes, or a key group's file
    of the earlier format)."""
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    epochs: dict[int, list[str]] = field(default_factory=dict)
    """Sink epochs the snapshot staged, epoch -> staged output files, not yet known published."""
    shared: bool = False
    """The keyed-state files are shared copies of this job's incremental checkpoints."""
    files: list[str] = field(default_factory=list)
    """Every file the snapshot references (what a CLAIM restore takes ownership of)."""
    end_of_input: bool = False
    """Taken after a bounded input was read to its end and its end-of-input hook ran: the
    job's final checkpoint. A job restored from it has nothing left to do."""
    channel_state: list[ChannelStateFile] = field(default_factory=list)
    """An unaligned checkpoint's in-flight records: processed before any new input."""
    channel_watermarks: list[tuple[int, int, int]] = field(default_factory=list)
    """(first, last key group, watermark) of each channel-state manifest that records one."""
    event_times: dict[tuple[str, int], int] = field(default_factory=dict)
    """Event time: each source partition's highest event time at the snapshot's cut."""
    watermarks: list[SubtaskWatermark] = field(default_factory=list)
    """Event time: each old keyed subtask's watermark (once its channel state is processed)
    and, unaligned, where it stood before its channel state."""

    @property
    def key_group_count(self) -> int:
        """Key groups the keyed-state files cover."""
        return len({g for f in self.state_files.values() for g in range(f.first, f.last + 1)})

    def watermarks_of(self, groups: KeyGroupRange) -> tuple[int, int] | None:
        """A new subtask's watermarks over ``groups``: where it starts and where it stands
        once its share of the channel state is processed, the lowest of the old subtasks'
        whose key groups overlap (a rescale can only hold a watermark back, never move it on:
        a record is never late after a restore that was not late before). None: the snapshot
        has no watermarks."""
        mine = [w for w in self.watermarks if w.first <= groups.end and groups.start <= w.last]
        if not mine:
            return None
        before = min(w.before if w.before is not None else w.value for w in mine)
        return before, min(w.value for w in mine)


@dataclass
class SubtaskWatermark:
    first: int
    last: int
    """The old subtask's key groups."""
    value: int
    """Its watermark at the barrier: once everything before the barrier is processed."""
    before: int | None = None
    """Unaligned: its watermark at the snapshot, before its channel state."""


def _protocol_prefix(url: str) -> str:
    return url.split("://", 1)[0] + "://" if "://" in url else ""


SOURCE_FORMAT = 2
"""Source snapshots are ``{"format": 2, "positions": {topic: {partition: offset}},
"end_of_input": bool}``, with event time also ``"event_time": {topic: {partition: ms}}`` (the
highest event time at the cut) and ``"watermark": {"key_groups": [first, last], "value": ms}``
(the keyed subtask of the same index, at the barrier); format 1 was the positions alone."""


def source_snapshot(data: dict[str, object]) -> tuple[dict[str, dict[str, int]], bool]:
    """(positions, end of input) from a source snapshot file of either format."""
    if data.get("format") == SOURCE_FORMAT:
        return data["positions"], bool(data.get("end_of_input"))  # type: ignore[return-value]
    return data, False  # type: ignore[return-value]


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


def load(
    path: str, job_id: str, checkpoint_dir: str, max_parallelism: int | None = None
) -> Restored:
    """A checkpoint or savepoint directory (or its ``_metadata`` file), wherever it lies now:
    files inside it are found relative to it. A snapshot taken with another max parallelism is
    refused (key groups are numbered modulo the max parallelism)."""
    directory = path[: -len("/_metadata")] if path.endswith("/_metadata") else path.rstrip("/")
    metadata = read_metadata(directory, job_id, max_parallelism)
    restored = Restored(
        metadata.checkpoint_id, directory, metadata.is_savepoint, files=metadata.files()
    )
    shared_prefix = job_dirs(checkpoint_dir, job_id)[0] + "/"
    all_shared = True
    for subtask in metadata.subtasks:
        for handle in subtask.handles:
            all_shared &= take_handle(restored, subtask.subtask_id, handle, shared_prefix)
    restored.shared = bool(restored.state_files) and all_shared and not restored.is_savepoint
    missing = missing_files({physical(path) for path in restored.state_files})
    missing += missing_files({f.path for f in restored.channel_state})
    if missing:
        raise NoCheckpoint(
            f"{directory} references {len(missing)} state files that no longer exist "
            f"(e.g. {missing[0]}): it cannot be restored"
        )
    for outputs in restored.epochs.values():
        outputs.sort()
    for first, last, before in restored.channel_watermarks:
        for watermark in restored.watermarks:
            if (watermark.first, watermark.last) == (first, last):
                watermark.before = before
    return restored


def read_metadata(directory: str, job_id: str, max_parallelism: int | None) -> SnapshotMetadata:
    """A snapshot's ``_metadata``, refused when it is missing, unreadable, or of another max
    parallelism."""
    try:
        data = read_file(f"{directory}/_metadata")
    except FileNotFoundError as exc:
        raise NoCheckpoint(f"{directory} has no _metadata: not a completed checkpoint") from exc
    try:
        metadata = SnapshotMetadata.from_json(data, directory)
    except BadMetadata as exc:
        raise NoCheckpoint(str(exc)) from None
    if metadata.job_id != job_id:
        log.warning("restoring job %s from a snapshot of job %s", job_id, metadata.job_id)
    if (
        max_parallelism is not None
        and metadata.max_parallelism is not None
        and metadata.max_parallelism != max_parallelism
    ):
        raise ValueError(
            f"{directory} was taken with max parallelism {metadata.max_parallelism}, the job has "
            f"{max_parallelism}: its key groups would land on other keys. Restore it with "
            f"max_parallelism={metadata.max_parallelism}"
        )
    return metadata


def take_handle(restored: Restored, subtask_id: str, handle: Handle, shared_prefix: str) -> bool:
    """Adds what one state handle holds to ``restored``; false when it is key-group state that
    is not one of the job's shared incremental files."""
    if handle.kind is StateHandleKind.KEYED_STATE and handle.key_groups is not None:
        start, end = handle.key_groups
        path = handle.path
        if handle.offset is not None and handle.segment is not None:  # in a merged file
            path = segment(path, handle.offset, handle.size, handle.segment)
        restored.state_files[path] = restored_file(path, handle.size, start, end)
        return handle.path.startswith(shared_prefix)
    if handle.kind is StateHandleKind.SOURCE_POSITIONS:
        data = json.loads(read_file(handle.path))
        positions, ended = source_snapshot(data)
        restored.end_of_input |= ended
        for topic, offsets in positions.items():
            for partition, offset in offsets.items():
                restored.positions[(topic, int(partition))] = int(offset)
        take_time(restored, data, handle.path)
    elif handle.kind is StateHandleKind.CHANNEL_STATE and handle.path.endswith(".json"):
        old_subtask = int(subtask_id.rsplit("-", 1)[-1])
        data = json.loads(read_file(handle.path))
        restored.channel_state += read_manifest_data(handle.path, data, old_subtask)
        before = manifest_watermark(data)
        if before is not None:
            start, end = data["key_groups"]
            restored.channel_watermarks.append((int(start), int(end), before))
    elif handle.kind is StateHandleKind.SINK_EPOCH:
        manifest = json.loads(read_file(handle.path))
        for epoch, outputs in manifest.items():
            restored.epochs.setdefault(int(epoch), []).extend(
                resolve(output, restored.external_path) for output in outputs
            )
    return True


def take_time(restored: Restored, data: dict[str, Any], path: str) -> None:
    """What a source snapshot holds of event time (`SOURCE_FORMAT`), checked: a value that is
    not an integer is refused with the file's name."""
    if data.get("format") != SOURCE_FORMAT:
        return
    try:
        for topic, highest in (data.get("event_time") or {}).items():
            for partition, value in highest.items():
                restored.event_times[(str(topic), int(partition))] = _integer(value)
        watermark = data.get("watermark")
        if watermark is not None:
            first, last = (_integer(g) for g in watermark["key_groups"])
            restored.watermarks.append(SubtaskWatermark(first, last, _integer(watermark["value"])))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise NoCheckpoint(f"{path}: malformed event time ({exc})") from None


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    return value


def missing_files(paths: set[str]) -> list[str]:
    """Those of ``paths`` that do not exist, found with one listing per directory (a state file
    is read lazily, by the first round that touches its key group: a checkpoint whose files went
    is refused at restore, before a later checkpoint could reference them again)."""
    by_directory: dict[str, set[str]] = {}
    for path in paths:
        by_directory.setdefault(posixpath.dirname(path), set()).add(path)
    missing: list[str] = []
    for directory, wanted in sorted(by_directory.items()):
        fs, root = url_to_fs(directory)
        try:
            names = {posixpath.basename(str(p).rstrip("/")) for p in fs.ls(root, detail=False)}
        except FileNotFoundError:
            names = set()
        missing += sorted(p for p in wanted if posixpath.basename(p) not in names)
    return missing


def resolve(path: str, directory: str) -> str:
    """A path a snapshot file names: relative ones lie inside the snapshot's directory."""
    if "://" in path or path.startswith("/"):
        return path
    return posixpath.join(directory, path)


# --- what `--restore latest` means -----------------------------------------------------------------


def latest_for_restart(
    bootstrap: str, codec: EventCodec, checkpoint_dir: str, job_id: str, *seen: str | None
) -> str | None:
    """What a restart restores: the coordinator's newest retained checkpoint, else the first of
    ``seen`` there is (the newest the agent saw complete, what the job started from), else
    nothing. The job owns it whichever it is (as Flink's failover owns its latest checkpoint):
    the agent's own view may lag the coordinator's (a checkpoint completes while the failed
    attempt stops, its notice never handled), and is never asked which."""
    try:
        record = latest_store_record(bootstrap, codec, job_id)
        found = resolve_latest(record, checkpoint_dir, job_id, True)
    except Exception as exc:  # unreadable now: what this agent saw complete
        log.warning("job %s: reading the checkpoint store failed: %s", job_id, exc)
        found = None
    return found or next((s for s in seen if s), None)


def resolve_latest(
    record: CheckpointStoreRecord | None,
    checkpoint_dir: str,
    job_id: str,
    allow_fresh_start: bool = False,
) -> str | None:
    """The snapshot ``--restore latest`` restores, or None to start from the beginning.

    The coordinator's store record decides, never a scan of directories that a failed discard
    may have left behind: the newest retained checkpoint that is not a savepoint (what a
    failover restores), or the savepoint the job was stopped with when that is newer (as Flink
    resumes a job stopped with a savepoint). If the job's checkpoints completed once but none is retained (its end
    discarded them), there is nothing to resume from and starting over would emit the whole
    input again: that is refused unless ``allow_fresh_start``. A job the coordinator has no
    completed checkpoint of starts from the beginning. Only when the coordinator has no record
    at all (a new job, or a broker that lost its topics) does storage decide."""
    if record is None:
        try:
            return latest_checkpoint(checkpoint_dir, job_id)
        except NoCheckpoint as exc:
            log.warning("job %s: %s; starting from the beginning", job_id, exc)
            return None
    candidates = [
        (r.checkpoint_id, r.external_path, "checkpoint")
        for r in record.retained
        if not r.snapshot_type.is_savepoint
    ] + [
        (s.checkpoint_id, s.external_path, "stop-with-savepoint savepoint")
        for s in record.savepoints
        if s.kind == "stop" and not s.disposed
    ]  # a job stopped with a savepoint resumes from it; intermediate savepoints are never used
    if candidates:
        checkpoint_id, path, what = max(candidates)
        fs, root = url_to_fs(f"{path}/_metadata")
        if not fs.exists(root):
            raise NoCheckpoint(
                f"the coordinator retains {what} {checkpoint_id} of job {job_id} at {path}, but "
                "it has no _metadata there (deleted by hand?)"
            )
        return path
    if record.last_completed_checkpoint_id is None:
        log.warning(
            "job %s: no checkpoint of it ever completed; starting from the beginning", job_id
        )
        return None
    discarded(record, job_id, allow_fresh_start)
    return None


def discarded(record: CheckpointStoreRecord, job_id: str, allow_fresh_start: bool) -> None:
    """The job's checkpoints completed once and none is retained (its end discarded them):
    starting over would emit the whole input again, so it is refused unless
    ``allow_fresh_start``."""
    status = record.job_status or "ended"
    retention = record.externalized_retention or "unknown"
    message = (
        f"job {job_id} {status} and its checkpoints were discarded when it ended "
        f"(execution.checkpointing.externalized-checkpoint-retention: {retention}); its last "
        f"completed checkpoint was {record.last_completed_checkpoint_id}. Nothing to restore. "
        "To start it from the beginning of its input on purpose (its sink receives the whole "
        "input again), add --allow-fresh-start; to keep the final checkpoint of later runs, set "
        "the retention to RETAIN_ON_CANCELLATION"
    )
    if not allow_fresh_start:
        raise NoCheckpoint(message)
    log.warning(
        "%s; starting from the beginning (--allow-fresh-start)", message.split(". Nothing")[0]
    )
