"""The option table (services/sparkpoint/common/options.py): every Flink 2.x option of the checkpointing,
recovery and restart families parses, older names are understood, a misspelled key is an error
that names the closest one, options without effect here are listed, and docs/settings.md shows
the table as the code has it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkpoint.common.options import (
    OPTIONS,
    OPTIONS_LIST,
    REST_OPTIONS,
    ConfigError,
    markdown_table,
    normalise,
    without_effect,
)
from sparkpoint.common.restarts import RestartConfig
from sparkpoint.common.settings import REST_FIELDS, CheckpointConfig, RecoveryConfig

ROOT = Path(__file__).resolve().parents[2]
FLINK_CONFIG = ROOT / "tests" / "flink-2.3-config.yaml"


def flink_configuration() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load(FLINK_CONFIG.read_text())
    return loaded


def test_a_flink_configuration_with_every_2x_option_is_accepted() -> None:
    options = flink_configuration()
    assert len(options) >= 50
    checkpointing = CheckpointConfig.from_options(options)
    recovery = RecoveryConfig.from_options(options)
    restart = RestartConfig.from_options(options)
    assert checkpointing.interval_ms == 10_000 and checkpointing.timeout_ms == 600_000
    assert recovery.claim_mode == "NO_CLAIM"
    assert restart.kind(checkpointing=True) == "exponential-delay"
    assert restart.attempts_before_reset == 2**31 - 1


def test_every_option_of_flink_2x_is_in_the_table() -> None:
    assert set(flink_configuration()) <= set(OPTIONS)


def test_options_without_effect_here_are_listed() -> None:
    listed = without_effect(flink_configuration())
    assert "execution.checkpointing.file-merging.pool-blocking" in listed
    assert "execution.checkpointing.file-merging.enabled" not in listed  # FLIP-306
    assert "execution.checkpointing.local-backup.enabled" not in listed  # local recovery
    assert "execution.checkpointing.interval" not in listed
    assert all(not OPTIONS[key].takes_effect for key in listed)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("state.checkpoints.dir", "execution.checkpointing.dir"),
        ("state.savepoints.dir", "execution.checkpointing.savepoint-dir"),
        ("state.backend.incremental", "execution.checkpointing.incremental"),
        ("execution.checkpointing.unaligned", "execution.checkpointing.unaligned.enabled"),
        ("execution.checkpointing.alignment-timeout", "execution.checkpointing.aligned-checkpoint-timeout"),
        ("restart-strategy", "restart-strategy.type"),
        ("execution.savepoint.path", "execution.state-recovery.path"),
        ("execution.savepoint-restore-mode", "execution.state-recovery.claim-mode"),
        ("execution.checkpointing.unaligned.during-recovery.enabled", "execution.checkpointing.during-recovery.enabled"),
    ],
)  # fmt: skip
def test_older_names_are_understood(old: str, new: str) -> None:
    assert normalise({old: "x"}) == {new: "x"}


def test_the_current_name_wins_over_an_alias_given_too() -> None:
    both = {"execution.checkpointing.dir": "/new", "state.checkpoints.dir": "/old"}
    assert normalise(both) == {"execution.checkpointing.dir": "/new"}
    assert normalise(dict(reversed(both.items()))) == {"execution.checkpointing.dir": "/new"}


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("execution.checkpointing.intervall", "execution.checkpointing.interval"),
        ("execution.checkpointing.tolerable-failed-checkpoint", "execution.checkpointing.tolerable-failed-checkpoints"),
        ("execution.state-recovery.claim-mod", "execution.state-recovery.claim-mode"),
    ],
)  # fmt: skip
def test_a_misspelled_key_is_an_error_naming_the_closest_one(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as error:
        CheckpointConfig.from_options({key: "1"})
    assert error.value.field == key and f"did you mean {suggestion}?" in str(error.value)


def test_keys_of_other_families_are_not_read_here() -> None:
    assert normalise({"pipeline.name": "x", "state.backend.type": "rocksdb"}) == {}


def test_the_patch_fields_come_from_the_table() -> None:
    assert set(REST_OPTIONS) == set(REST_FIELDS)


def test_effective_options_round_trip_through_flinks_names() -> None:
    config = CheckpointConfig.from_options(
        {
            "execution.checkpointing.interval": "30 s",
            "execution.checkpointing.mode": "AT_LEAST_ONCE",
        }
    )
    assert CheckpointConfig.from_options(config.to_options()) == config


def test_docs_show_the_option_table_as_the_code_has_it() -> None:
    docs = (ROOT / "docs" / "settings.md").read_text()
    assert markdown_table() in docs, "regenerate with: python -m sparkpoint.common.options"


def test_every_option_says_what_it_does_here() -> None:
    for option in OPTIONS_LIST:
        assert option.meaning and option.effect, option.key


def test_the_state_backends_options_outside_the_families_are_read() -> None:
    """They were accepted and silently ignored: only the families' keys were read."""
    config = CheckpointConfig.from_options(
        {
            "state.changelog.periodic-materialize.interval": "30 s",
            "state.backend.memory.fixed-per-slot": "64 mb",
            "state.backend.local-recovery": "true",
        }
    )
    assert config.materialize_interval_ms == 30_000
    assert config.state_memory_bytes == 64 << 20 and config.local_backup
    with pytest.raises(ConfigError, match=r"state\.backend\.memory\.fixed-per-slot"):
        CheckpointConfig.from_options({"state.backend.memory.fixed-per-slot": "100 kb"})
