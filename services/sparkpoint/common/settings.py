"""Checkpoint and recovery settings under Flink's option names.

A job's configuration comes from a YAML file (``--config``), the job definition, and runtime
overrides (PATCH); every layer speaks Flink's option names, e.g.
``execution.checkpointing.interval: 10s``. Which options exist, their types, aliases and whether
they take effect here is the table in `sparkpoint.common.options`. Durations follow Flink's syntax
(``500ms``, ``30 s``, ``10min``, ``1h``; a bare number is milliseconds). Defaults are Flink's,
except where a docstring says otherwise.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkpoint.common.events import CheckpointSettings, JobStatus
from sparkpoint.common.options import (
    OPTIONS_LIST,
    ConfigError,
    Kind,
    Option,
    Section,
    format_duration,
    parse_duration,
    parse_section,
)

__all__ = ["ConfigError", "format_duration", "parse_duration"]

PREFIX = "execution.checkpointing."


REST_FIELDS = {
    "checkpointInterval": "checkpoint_interval_ms",
    "checkpointTimeout": "checkpoint_timeout_ms",
    "minPauseBetweenCheckpoints": "min_pause_ms",
    "maxConcurrentCheckpoints": "max_concurrent_checkpoints",
    "tolerableCheckpointFailureNumber": "tolerable_failed_checkpoints",
    "alignedCheckpointTimeout": "aligned_checkpoint_timeout_ms",
    "unalignedCheckpoints": "unaligned",
}
"""The fields of ``PATCH /jobs/:id/checkpoints/configuration`` (FLIP-571 names) and the
`CheckpointSettings` field each sets."""


class CheckpointingMode(enum.Enum):
    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedRetention(enum.Enum):
    """What happens to retained checkpoints when the job terminates (Flink's
    ExternalizedCheckpointRetention). Savepoints are never deleted on termination."""

    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"

    def discards_on(self, status: JobStatus) -> bool:
        """Whether retained checkpoints are discarded when the job ends with ``status``."""
        if self is ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS:
            return status.is_terminal or status is JobStatus.SUSPENDED
        if self is ExternalizedRetention.DELETE_ON_CANCELLATION:
            return status in (JobStatus.CANCELED, JobStatus.FINISHED)
        return False

    @property
    def enabled(self) -> bool:
        return self is not ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS


@dataclass(frozen=True)
class CheckpointConfig:
    """The effective checkpoint configuration of one job. Durations in ms; None where Flink's
    option has no value (periodic checkpointing disabled, no backlog interval, ...)."""

    interval_ms: int | None = None
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failed: int = 0
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    unaligned: bool = False
    aligned_checkpoint_timeout_ms: int = 0
    externalized_retention: ExternalizedRetention = (
        ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS
    )
    num_retained: int = 1
    incremental: bool = False
    checkpoint_dir: str = ".sparkpoint/checkpoints"
    savepoint_dir: str = ".sparkpoint/savepoints"
    """Flink has no default savepoint directory; sparkpoint has one so that `sparkpoint
    savepoint JOB` works on a fresh setup."""
    checkpoints_after_tasks_finish: bool = True
    interval_during_backlog_ms: int | None = None
    unaligned_recover_output_on_downstream: bool = False
    unaligned_during_recovery: bool = False
    periodic_savepoint_interval_ms: int | None = None
    materialize_interval_ms: int = 600_000
    """``state.changelog.periodic-materialize.interval``: Flink's default."""
    state_memory_bytes: int = 256 << 20
    """``state.backend.memory.fixed-per-slot``: a Python worker's budget for keyed state held in
    memory."""
    local_backup: bool = False
    """``execution.checkpointing.local-backup.enabled``."""
    local_backup_dirs: str | None = None
    """``execution.checkpointing.local-backup.dirs``: None, the system's temporary directory."""
    file_merging: bool = False
    """``execution.checkpointing.file-merging.enabled`` (FLIP-306)."""
    file_merging_max_bytes: int = 32 << 20
    """``execution.checkpointing.file-merging.max-file-size``."""
    buffer_debloat: bool = False
    """``taskmanager.network.memory.buffer-debloat.enabled`` (FLIP-183)."""
    buffer_debloat_target_ms: int = 1_000
    buffer_debloat_samples: int = 20
    buffer_timeout_ms: int = 0
    """``execution.buffer-timeout.interval``: without a backlog, a round starts at most this
    often; 0 (not Flink's 100 ms): back to back, the lowest latency."""
    periodic_savepoint_num_retained: int = 3
    """FLIP-10 bounds the periodic savepoints kept without naming a default; three covers the
    last few intervals without letting a forgotten job fill its savepoint directory."""

    def validate(self) -> CheckpointConfig:
        """Returns self, or raises `ConfigError` naming the first invalid option."""
        positive = [("interval", self.interval_ms), ("timeout", self.timeout_ms)]
        if self.state_memory_bytes < 1 << 20:
            raise ConfigError(
                "state.backend.memory.fixed-per-slot",
                f"must be at least 1 mb, got {self.state_memory_bytes} bytes",
            )
        if self.file_merging_max_bytes < 1:
            raise ConfigError(
                PREFIX + "file-merging.max-file-size",
                f"must be > 0, got {self.file_merging_max_bytes} bytes",
            )
        debloat = "taskmanager.network.memory.buffer-debloat."
        if self.buffer_debloat_target_ms <= 0:
            raise ConfigError(
                debloat + "target", f"must be > 0, got {self.buffer_debloat_target_ms} ms"
            )
        if self.buffer_debloat_samples < 1:
            raise ConfigError(
                debloat + "samples", f"must be >= 1, got {self.buffer_debloat_samples}"
            )
        if self.buffer_timeout_ms < 0:
            raise ConfigError(
                "execution.buffer-timeout.interval", f"must be >= 0, got {self.buffer_timeout_ms}"
            )
        if self.materialize_interval_ms <= 0:
            raise ConfigError(
                "state.changelog.periodic-materialize.interval",
                f"must be > 0, got {self.materialize_interval_ms}",
            )
        for option, value in positive:
            if value is not None and value <= 0:
                raise ConfigError(PREFIX + option, f"must be > 0, got {value}")
        non_negative = [
            ("min-pause", self.min_pause_ms),
            ("tolerable-failed-checkpoints", self.tolerable_failed),
            ("aligned-checkpoint-timeout", self.aligned_checkpoint_timeout_ms),
        ]
        for option, value in non_negative:
            if value < 0:
                raise ConfigError(PREFIX + option, f"must be >= 0, got {value}")
        at_least_one = [
            ("max-concurrent-checkpoints", self.max_concurrent),
            ("num-retained", self.num_retained),
            ("periodic-savepoint.num-retained", self.periodic_savepoint_num_retained),
        ]
        for option, value in at_least_one:
            if value < 1:
                raise ConfigError(PREFIX + option, f"must be >= 1, got {value}")
        if (
            self.periodic_savepoint_interval_ms is not None
            and self.periodic_savepoint_interval_ms <= 0
        ):
            raise ConfigError(PREFIX + "periodic-savepoint.interval", "must be > 0")
        backlog = self.interval_during_backlog_ms
        if backlog and (
            backlog < 0 or (self.interval_ms is not None and backlog < self.interval_ms)
        ):
            raise ConfigError(
                PREFIX + "interval-during-backlog",
                f"must be 0 (no checkpoints during backlog) or >= the interval, got {backlog}",
            )
        if self.unaligned and self.mode is not CheckpointingMode.EXACTLY_ONCE:
            raise ConfigError(
                PREFIX + "unaligned.enabled", "unaligned checkpoints need mode EXACTLY_ONCE"
            )
        if self.unaligned and self.max_concurrent != 1:
            raise ConfigError(
                PREFIX + "max-concurrent-checkpoints",
                f"unaligned checkpoints need max concurrent checkpoints 1, got {self.max_concurrent}",
            )
        return self

    @property
    def periodic(self) -> bool:
        return self.interval_ms is not None

    def current_interval_ms(self, backlog: bool) -> int | None:
        """The interval in force: the backlog interval while sources report backlog (FLIP-309);
        None when no periodic checkpoint is due (disabled, or 0 during backlog)."""
        if backlog and self.interval_during_backlog_ms is not None:
            return self.interval_during_backlog_ms or None
        return self.interval_ms

    # --- runtime overrides (FLIP-571 and beyond) ------------------------------------------------

    def settings(self) -> CheckpointSettings:
        """The values a runtime change can touch, as carried by ConfigChange events."""
        return CheckpointSettings(
            checkpoint_interval_ms=self.interval_ms,
            checkpoint_timeout_ms=self.timeout_ms,
            min_pause_ms=self.min_pause_ms,
            max_concurrent_checkpoints=self.max_concurrent,
            tolerable_failed_checkpoints=self.tolerable_failed,
            aligned_checkpoint_timeout_ms=self.aligned_checkpoint_timeout_ms,
            unaligned=self.unaligned,
        )

    def with_overrides(self, overrides: CheckpointSettings) -> CheckpointConfig:
        """This configuration with every non-null override applied, validated."""
        changes: dict[str, Any] = {
            field: value
            for field, value in (
                ("interval_ms", overrides.checkpoint_interval_ms),
                ("timeout_ms", overrides.checkpoint_timeout_ms),
                ("min_pause_ms", overrides.min_pause_ms),
                ("max_concurrent", overrides.max_concurrent_checkpoints),
                ("tolerable_failed", overrides.tolerable_failed_checkpoints),
                ("aligned_checkpoint_timeout_ms", overrides.aligned_checkpoint_timeout_ms),
                ("unaligned", overrides.unaligned),
            )
            if value is not None
        }
        return dataclasses.replace(self, **changes).validate()

    # --- Flink option names ------------------------------------------------------------------------

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], base: CheckpointConfig | None = None
    ) -> CheckpointConfig:
        """A configuration from Flink options over ``base`` (defaults). Keys of other families
        are ignored; an unknown key of the checkpointing, recovery or restart families is an
        error naming the closest known one."""
        changes = parse_section(options, Section.CHECKPOINTING)
        if "mode" in changes:
            changes["mode"] = CheckpointingMode[changes["mode"]]
        if "externalized_retention" in changes:
            changes["externalized_retention"] = ExternalizedRetention[
                changes["externalized_retention"]
            ]
        return dataclasses.replace(base or cls(), **changes).validate()

    def to_options(self) -> dict[str, str]:
        """Every option that takes effect, with its effective value, as Flink writes them (None
        values left out)."""
        options = {}
        for option in OPTIONS_LIST:
            if option.section is not Section.CHECKPOINTING or option.field is None:
                continue
            value = getattr(self, option.field)
            if value is not None:
                options[option.key] = show_value(option, value)
        return options


@dataclass(frozen=True)
class RecoveryConfig:
    """``execution.state-recovery.*``: what an agent restores and who owns it afterwards."""

    path: str | None = None
    claim_mode: str = "NO_CLAIM"
    """CLAIM: the restored snapshot becomes a checkpoint the job owns (and may delete once
    subsumed); NO_CLAIM (and Flink's LEGACY): it is never touched, the first checkpoint is full."""
    ignore_unclaimed_state: bool = False
    without_channel_state_checkpoint_id: int = -1
    from_local: bool = False
    """``execution.state-recovery.from-local``: restore from local copies where they exist."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RecoveryConfig:
        return dataclasses.replace(cls(), **parse_section(options, Section.RECOVERY))

    @property
    def claims(self) -> bool:
        return self.claim_mode == "CLAIM"


def show_value(option: Option, value: Any) -> str:
    """A value as Flink writes it in a configuration."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if option.kind is Kind.DURATION:
        return format_duration(int(value))
    return str(value)
