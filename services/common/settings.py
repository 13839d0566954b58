"""Checkpoint settings under Flink's option names.

A job's configuration comes from a YAML file (``--config``), the job definition, and runtime
overrides (PATCH); every layer speaks the option names of the contract, e.g.
``execution.checkpointing.interval: 10s``. Durations follow Flink's syntax (``500ms``, ``30 s``,
``10min``, ``1h``; a bare number is milliseconds). Defaults are Flink's, except where a
docstring says otherwise.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.common.events import CheckpointSettings, JobStatus

PREFIX = "execution.checkpointing."


REST_FIELDS = {
    "checkpointInterval": "checkpoint_interval_ms",
    "checkpointTimeout": "checkpoint_timeout_ms",
    "minPauseBetweenCheckpoints": "min_pause_ms",
    "maxConcurrentCheckpoints": "max_concurrent_checkpoints",
    "tolerableCheckpointFailureNumber": "tolerable_failed_checkpoints",
    "alignedCheckpointTimeout": "aligned_checkpoint_timeout_ms",
}
"""The fields of ``PATCH /jobs/:id/checkpoints/configuration`` (FLIP-571 names) and the
`CheckpointSettings` field each sets."""


class ConfigError(ValueError):
    """A setting is invalid; ``field`` names it (option name or REST field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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


_UNITS_MS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip
_DURATION = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_duration(text: str | int) -> int:
    """Milliseconds from Flink's duration syntax; a bare number is milliseconds."""
    if isinstance(text, int):
        return text
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 500ms, 30s, 10min, 1h)")
    number, unit = match.groups()
    factor = _UNITS_MS.get(unit.lower() or "ms")
    if factor is None:
        raise ValueError(f"{text!r}: unknown unit {unit!r} (ms, s, min, h, d)")
    return int(number) * factor


def format_duration(ms: int) -> str:
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def _parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError(f"{text!r} is not true or false")


def _parse_int(text: str | int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a whole number") from None


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda text: (
        None if text is None or str(text).strip().lower() in ("", "none") else parse(text)
    )


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
    periodic_savepoint_num_retained: int = 3
    """FLIP-10 bounds the periodic savepoints kept without naming a default; three covers the
    last few intervals without letting a forgotten job fill its savepoint directory."""

    def validate(self) -> CheckpointConfig:
        """Returns self, or raises `ConfigError` naming the first invalid option."""
        positive = [("interval", self.interval_ms), ("timeout", self.timeout_ms)]
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
            )
            if value is not None
        }
        return dataclasses.replace(self, **changes).validate()

    # --- Flink option names ------------------------------------------------------------------------

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], base: CheckpointConfig | None = None
    ) -> CheckpointConfig:
        """A configuration from ``execution.checkpointing.*`` options over ``base`` (defaults);
        other keys are ignored, an unknown ``execution.checkpointing.*`` key is an error."""
        changes: dict[str, Any] = {}
        for key, raw in options.items():
            if not key.startswith(PREFIX):
                continue
            option = _OPTIONS.get(key[len(PREFIX) :])
            if option is None:
                raise ConfigError(key, "unknown checkpointing option")
            field, parse, _ = option
            try:
                changes[field] = parse(raw)
            except ValueError as exc:
                raise ConfigError(key, str(exc)) from None
        return dataclasses.replace(base or cls(), **changes).validate()

    def to_options(self) -> dict[str, str]:
        """Every option with its effective value, as Flink writes them (None values left out)."""
        options = {}
        for name, (field, _, show) in _OPTIONS.items():
            value = getattr(self, field)
            if value is not None:
                options[PREFIX + name] = show(value)
        return options


def _enum(cls: type[enum.Enum]) -> Callable[[Any], Any]:
    def parse(text: Any) -> Any:
        if isinstance(text, cls):
            return text
        try:
            return cls[str(text).strip().upper()]
        except KeyError:
            raise ValueError(f"{text!r} is not one of {', '.join(cls.__members__)}") from None

    return parse


def _show_bool(value: bool) -> str:
    return "true" if value else "false"


_OPTIONS: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], str]]] = {
    "interval": ("interval_ms", _optional(parse_duration), format_duration),
    "timeout": ("timeout_ms", parse_duration, format_duration),
    "min-pause": ("min_pause_ms", parse_duration, format_duration),
    "max-concurrent-checkpoints": ("max_concurrent", _parse_int, str),
    "tolerable-failed-checkpoints": ("tolerable_failed", _parse_int, str),
    "mode": ("mode", _enum(CheckpointingMode), lambda v: v.value),
    "unaligned.enabled": ("unaligned", _parse_bool, _show_bool),
    "aligned-checkpoint-timeout": (
        "aligned_checkpoint_timeout_ms",
        parse_duration,
        format_duration,
    ),
    "externalized-checkpoint-retention": (
        "externalized_retention",
        _enum(ExternalizedRetention),
        lambda v: v.value,
    ),
    "num-retained": ("num_retained", _parse_int, str),
    "incremental": ("incremental", _parse_bool, _show_bool),
    "dir": ("checkpoint_dir", str, str),
    "savepoint-dir": ("savepoint_dir", str, str),
    "checkpoints-after-tasks-finish": ("checkpoints_after_tasks_finish", _parse_bool, _show_bool),
    "interval-during-backlog": (
        "interval_during_backlog_ms",
        _optional(parse_duration),
        format_duration,
    ),
    "unaligned.recover-output-on-downstream.enabled": (
        "unaligned_recover_output_on_downstream",
        _parse_bool,
        _show_bool,
    ),
    "unaligned.during-recovery.enabled": ("unaligned_during_recovery", _parse_bool, _show_bool),
    "periodic-savepoint.interval": (
        "periodic_savepoint_interval_ms",
        _optional(parse_duration),
        format_duration,
    ),
    "periodic-savepoint.num-retained": ("periodic_savepoint_num_retained", _parse_int, str),
}
