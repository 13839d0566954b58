"""Checkpoint settings under Flink's option names: parsing, validation, overrides."""

from __future__ import annotations

import pytest

from sparkpoint.common.events import CheckpointSettings
from sparkpoint.common.settings import (
    CheckpointConfig,
    CheckpointingMode,
    ConfigError,
    ExternalizedRetention,
    format_duration,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("500", 500), ("30s", 30_000), ("30 s", 30_000), ("10min", 600_000), ("10 m", 600_000),
     ("1h", 3_600_000), ("2d", 172_800_000), ("1 seconds", 1000)],
)  # fmt: skip
def test_durations_parse_as_flink_writes_them(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "ten seconds", "10 parsecs", "-5s", "1.5s"])
def test_bad_durations_are_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_durations_format_in_the_largest_whole_unit() -> None:
    assert [format_duration(v) for v in (500, 30_000, 600_000, 90_000)] == [
        "500ms",
        "30s",
        "10min",
        "90s",
    ]


def test_defaults_are_flinks() -> None:
    config = CheckpointConfig()
    assert (config.interval_ms, config.timeout_ms, config.min_pause_ms, config.max_concurrent) == (
        None,
        600_000,
        0,
        1,
    )
    assert (config.tolerable_failed, config.num_retained, config.unaligned) == (0, 1, False)
    assert config.mode is CheckpointingMode.EXACTLY_ONCE
    assert config.externalized_retention is ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS


def test_options_round_trip() -> None:
    options = {
        "execution.checkpointing.interval": "10s",
        "execution.checkpointing.timeout": "15min",
        "execution.checkpointing.min-pause": "500ms",
        "execution.checkpointing.max-concurrent-checkpoints": "2",
        "execution.checkpointing.tolerable-failed-checkpoints": "3",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "3",
        "execution.checkpointing.interval-during-backlog": "1min",
        "execution.checkpointing.periodic-savepoint.interval": "1h",
        "state.backend.type": "ignored: not a checkpointing option",
    }
    config = CheckpointConfig.from_options(options)
    assert (config.interval_ms, config.timeout_ms, config.min_pause_ms) == (10_000, 900_000, 500)
    assert config.externalized_retention is ExternalizedRetention.RETAIN_ON_CANCELLATION
    assert CheckpointConfig.from_options(config.to_options()) == config


def test_an_unknown_checkpointing_option_is_named() -> None:
    with pytest.raises(ConfigError) as raised:
        CheckpointConfig.from_options({"execution.checkpointing.intervall": "10s"})
    assert raised.value.field == "execution.checkpointing.intervall"


def test_a_bad_value_names_its_option() -> None:
    with pytest.raises(ConfigError, match=r"execution\.checkpointing\.timeout"):
        CheckpointConfig.from_options({"execution.checkpointing.timeout": "soon"})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"interval_ms": 0}, "execution.checkpointing.interval"),
        ({"timeout_ms": -1}, "execution.checkpointing.timeout"),
        ({"min_pause_ms": -1}, "execution.checkpointing.min-pause"),
        ({"max_concurrent": 0}, "execution.checkpointing.max-concurrent-checkpoints"),
        ({"tolerable_failed": -1}, "execution.checkpointing.tolerable-failed-checkpoints"),
        (
            {"unaligned": True, "max_concurrent": 2},
            "execution.checkpointing.max-concurrent-checkpoints",
        ),
        (
            {"unaligned": True, "mode": CheckpointingMode.AT_LEAST_ONCE},
            "execution.checkpointing.unaligned.enabled",
        ),
        (
            {"interval_ms": 10_000, "interval_during_backlog_ms": 5_000},
            "execution.checkpointing.interval-during-backlog",
        ),
    ],
)
def test_validation_names_the_invalid_option(changes: dict[str, object], field: str) -> None:
    import dataclasses

    with pytest.raises(ConfigError) as raised:
        dataclasses.replace(CheckpointConfig(), **changes).validate()  # type: ignore[arg-type]
    assert raised.value.field == field


def test_backlog_interval_of_zero_disables_checkpoints_during_backlog() -> None:
    config = CheckpointConfig(interval_ms=1000, interval_during_backlog_ms=0).validate()
    assert config.current_interval_ms(backlog=False) == 1000
    assert config.current_interval_ms(backlog=True) is None
    assert CheckpointConfig(interval_ms=1000).current_interval_ms(backlog=True) == 1000


def test_overrides_apply_only_what_is_set() -> None:
    base = CheckpointConfig(interval_ms=10_000, timeout_ms=600_000, min_pause_ms=100)
    config = base.with_overrides(CheckpointSettings(checkpoint_timeout_ms=900_000))
    assert (config.interval_ms, config.timeout_ms, config.min_pause_ms) == (10_000, 900_000, 100)
    assert config.settings().checkpoint_timeout_ms == 900_000


def test_overrides_are_validated() -> None:
    with pytest.raises(ConfigError):
        CheckpointConfig(unaligned=True).with_overrides(
            CheckpointSettings(max_concurrent_checkpoints=2)
        )
