"""One attempt of the job: the parts a restart replaces (channels, restored channel state, the
state backend, the source reader, the sink's epochs, the subtask checkpointer), made by
`AttemptMaker`; and what starting one involves that is not the agent's lifecycle: which
snapshot it restores and what it takes over of it (`restored_snapshot`), and the working files
of earlier runs it removes once accepted (`clean_task_owned`)."""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fsspec.core import url_to_fs

from sparkpoint.agent.checkpointing.acks import Acknowledgements
from sparkpoint.agent.checkpointing.copies import Fold
from sparkpoint.agent.checkpointing.snapshots import (
    AttemptParts,
    JobShape,
    Outcomes,
    SubtaskCheckpointer,
)
from sparkpoint.agent.control.progress import Progress
from sparkpoint.agent.job import FileSource, Job, declared_state, has_timers
from sparkpoint.agent.options import AgentOptions, Places
from sparkpoint.agent.recovery.filter_jobs import adopt
from sparkpoint.agent.recovery.restore import Restored, load, resolve_latest
from sparkpoint.agent.recovery.split import ChannelRecovery
from sparkpoint.agent.rounds.channels import Channel, Segment, SegmentFiles
from sparkpoint.agent.rounds.initial import initial_state
from sparkpoint.agent.sinks import EpochCommitter, SinkWriter
from sparkpoint.agent.sinks.ledger import EpochLedger
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.spark.jobs import SNAPSHOT_POOL, SparkJobs
from sparkpoint.agent.state import local
from sparkpoint.agent.state.backend import local_path
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.agent.state.local import job_local_dir
from sparkpoint.agent.state.runs import fold
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import latest_store_record
from sparkpoint.common.events import JobRegistered, JobStatus, Subtask
from sparkpoint.common.kafka import EventPublisher
from sparkpoint.common.keygroups import KeyGroupRange
from sparkpoint.common.redaction import redact_options
from sparkpoint.common.settings import CheckpointConfig, RecoveryConfig

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    parts: AttemptParts
    checkpointer: SubtaskCheckpointer
    restored: Restored | None

    @property
    def finished_before(self) -> bool:
        """Restored from the final checkpoint of a bounded job: nothing is left to do."""
        return self.restored is not None and self.restored.end_of_input

    def close_source(self) -> None:
        try:
            self.parts.source.close()
        except Exception as exc:  # closing after a failure: report, go on closing
            log.warning("closing the source: %s", exc)


@dataclass
class AttemptMaker:
    """Makes the parts of each attempt, from what stays across attempts."""

    job: Job
    options: AgentOptions
    config: CheckpointConfig
    recovery: RecoveryConfig
    places: Places
    ranges: list[KeyGroupRange]
    subtasks: int
    publisher: EventPublisher
    agent_id: str
    copier: ThreadPoolExecutor
    segment_files: SegmentFiles
    outcomes: Outcomes
    progress: Progress
    taken: Callable[[], dict[int, list[Segment]]]
    """The segments the stage-2 round in flight took (`Rounds.taken`)."""
    attempt: Callable[[], int]
    """The attempt the coordinator accepted."""
    source_ends: dict[tuple[str, int], int]
    """A bounded Kafka source's end offsets, kept across restarts in this process."""
    jobs: SparkJobs | None = None
    """Where canonical savepoints fold key groups (None: savepoints copy the files as they are)."""

    def make(
        self, restored: Restored | None, sink: SinkWriter, committer: EpochCommitter
    ) -> Attempt:
        """The parts of a new attempt, restored where ``restored`` says."""
        parallelism = len(self.ranges)
        channels = [Channel(i, self.options.capacity_bytes) for i in range(parallelism)]
        backend = self._state_backend()
        source = self._source_reader()
        restoring = ChannelRecovery()
        if restored is not None:
            self._check_positions(restored, source)
            backend.restore(restored.state_files.values(), restored.shared)
            if has_timers(self.job.function):  # read each key group's timers once
                groups = {
                    g for f in restored.state_files.values() for g in range(f.first, f.last + 1)
                }
                backend.timers.restored(groups)
                backend.processing_timers.restored(groups)
        self._local_recovery(backend, restored)
        source.start(
            restored.positions if restored else None, restored.event_times if restored else None
        )
        if restored is not None:
            restore_watermarks(restored, channels, self.ranges)
        self.progress.start(source.positions)
        self.progress.seen_ends(source.ends.items())
        if restored is not None and restored.channel_state:
            restoring = adopt(
                self.job.id, restored, self.recovery.without_channel_state_checkpoint_id,
                self.ranges, channels, self.places.channel_dir,
                self.config.unaligned_during_recovery, self.options.capacity_bytes,
            )  # fmt: skip
        ledger = EpochLedger(self.job.id, sink, committer)
        initial = None
        if restored is None:  # a fresh start: the job's initial state, if it has one
            initial = initial_state(
                self.job.function, self.job.key, self.ranges[-1].end + 1, parallelism,
                self.places.channel_dir,
            )  # fmt: skip
        parts = AttemptParts(channels, restoring, backend, source, ledger, initial)
        acks = Acknowledgements(
            self.publisher, self.job.id, self.agent_id, self.attempt, self.subtasks,
            self.outcomes.declined,
        )  # fmt: skip
        shape = JobShape(
            self.job.id, self.ranges, self.config, self.places.shared_dir,
            self.places.channel_dir, self._fold(),
        )  # fmt: skip
        checkpointer = SubtaskCheckpointer(
            shape, parts, acks, self.copier, self.segment_files, self.outcomes, self.taken,
            restored.checkpoint_id if restored else 0,
        )  # fmt: skip
        return Attempt(parts, checkpointer, restored)

    def _state_backend(self) -> StateBackend:
        state_dir, config = self.places.state_dir, self.config
        remote = local_path(state_dir) is None
        return StateBackend(
            state_dir,
            materialize_interval_s=config.materialize_interval_ms / 1000,
            memory_bytes=config.state_memory_bytes,
            local_dir=job_local_dir(config.local_backup_dirs, self.job.id) if remote else None,
            local_backup=config.local_backup,
            merged_file_bytes=config.file_merging_max_bytes if config.file_merging else None,
        )

    def _local_recovery(self, backend: StateBackend, restored: Restored | None) -> None:
        """With state on an object store: local copies of the restored files are kept for the
        tasks to read (``from-local``), everything else in the job's local directory goes."""
        if backend.local_dir is None:
            return
        if restored is None or not self.recovery.from_local:
            local.clear(backend.local_dir)
            return
        files = [f.path for f in restored.state_files.values()]
        kept = local.keep_only(backend.local_dir, files)
        log.info(
            "job %s: local recovery: %d of %d restored state files on this machine's disk",
            self.job.id, kept, len(files),
        )  # fmt: skip

    def _fold(self) -> Fold | None:
        """A canonical savepoint's fold of a subtask's key groups, as a Spark task."""
        jobs, declared = self.jobs, declared_state(self.job.function)
        if jobs is None:
            return None
        work = functools.partial(fold, declared=declared)
        return lambda state: jobs.run(SNAPSHOT_POOL, "savepoint: key groups folded", [state], work)[
            0
        ]

    def _source_reader(self) -> KafkaSourceReader | FileSourceReader:
        source = self.job.source
        if isinstance(source, FileSource):
            return FileSourceReader(source, len(self.ranges))
        return KafkaSourceReader(
            source, self.options.bootstrap, len(self.ranges), ends=self.source_ends
        )

    def _check_positions(
        self, restored: Restored, source: KafkaSourceReader | FileSourceReader
    ) -> None:
        unknown = {t for t, _ in restored.positions} - set(source.names)
        if unknown and not (
            self.options.allow_non_restored_state or self.recovery.ignore_unclaimed_state
        ):
            raise ValueError(
                f"the snapshot has positions of topics {sorted(unknown)} that the job does not read; "
                "pass --allow-non-restored-state to drop them"
            )


def restore_watermarks(
    restored: Restored, channels: list[Channel], ranges: list[KeyGroupRange]
) -> None:
    """Each new subtask starts at the watermark its key groups' old subtasks stood at (before
    their channel state, unaligned) and reaches their watermark at the barrier once its share
    of the channel state is processed."""
    for channel, groups in zip(channels, ranges, strict=True):
        watermarks = restored.watermarks_of(groups)
        if watermarks is not None:
            channel.watermark, channel.restored_mark = watermarks


def restored_snapshot(
    restore: str,
    job_id: str,
    places: Places,
    options: AgentOptions,
    recovery: RecoveryConfig,
    codec: EventCodec,
    max_parallelism: int,
    own: bool,
) -> Restored | None:
    """The snapshot to restore. ``latest`` is the job's own (as a failover restores it); an
    explicit path follows the claim mode: only CLAIM (or ``own``: the job's own latest or the
    snapshot it started from) lets the job build on its files."""
    if restore == "latest":
        record = latest_store_record(options.bootstrap, codec, job_id)
        found = resolve_latest(record, places.checkpoint_dir, job_id, options.allow_fresh_start)
        if found is None:
            return None
        path, own = found, True
    else:
        path = restore
    log.info("job %s: restoring from %s", job_id, path)
    restored = load(path, job_id, places.checkpoint_dir, max_parallelism)
    # NO_CLAIM: the first checkpoint copies every key group, the snapshot stays untouched
    restored.shared &= own or recovery.claims
    return restored


def clean_task_owned(places: Places, options: AgentOptions, job_id: str) -> None:
    """Working state, staged output and segment files of earlier runs of the job (other
    agents, all gone: this one was accepted): nothing restored points at them any more."""
    fs, root = url_to_fs(places.taskowned_dir)
    if fs.exists(root):
        for entry in fs.ls(root, detail=False):
            if posixpath.basename(str(entry).rstrip("/")) != places.run_name:
                fs.rm(entry, recursive=True)
    for directory in (places.state_dir, places.sink_dir):  # this agent's own, after a restart
        # a task of the failed attempt may still be writing here (cancelled jobs' Python
        # workers end a moment later): what it leaves has a round number never used again
        remove_tree(directory)
    if options.channel_dir:  # segments of the job's earlier runs under a shared root
        fs, root = url_to_fs(options.channel_dir)
        mine = posixpath.basename(url_to_fs(places.channel_dir)[1])
        for entry in fs.ls(root, detail=False) if fs.exists(root) else []:
            name = posixpath.basename(str(entry).rstrip("/"))
            if name.startswith(f"{job_id}-agent-") and name != mine:
                fs.rm(entry, recursive=True)


def remove_tree(url: str) -> None:
    """Deletes a directory (local path or URL) that may not exist."""
    try:
        fs, root = url_to_fs(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", url, exc)


def registration(
    job: Job,
    agent_id: str,
    attempt: int,
    ranges: list[KeyGroupRange],
    settings: dict[str, str],
    restored: Restored | None,
    timestamp: int,
) -> JobRegistered:
    """Attempt ``attempt``'s registration: its subtasks (a source and a keyed one per key-group
    range), its settings (secrets redacted: the event is kept on a compacted topic and shown by
    the REST API), and the snapshot it restored."""
    subtasks = [Subtask(f"source-{i}", i, r.start, r.end) for i, r in enumerate(ranges)]
    subtasks += [Subtask(f"keyed-{i}", i, r.start, r.end) for i, r in enumerate(ranges)]
    return JobRegistered(
        job.id, job.name, agent_id, attempt, JobStatus.RUNNING, len(ranges), job.max_parallelism,
        subtasks, redact_options(settings), timestamp,
        restored.checkpoint_id if restored else None,
        restored.external_path if restored else None,
    )  # fmt: skip
