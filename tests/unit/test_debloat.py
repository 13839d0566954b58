"""Buffer debloating for rounds (services/sparkpoint/agent/rounds/debloat.py), pure: the rate of
rounds that had work, and the reads it bounds; its options."""

from __future__ import annotations

import pytest

from sparkpoint.agent.rounds.debloat import MIN_RECORDS_PER_PARTITION, Debloater
from sparkpoint.common.settings import CheckpointConfig, ConfigError

DEBLOAT = "taskmanager.network.memory.buffer-debloat."


def test_a_round_reads_what_rounds_process_in_the_target_time() -> None:
    debloat = Debloater(target_ms=500, samples=1)
    assert debloat.budget is None and debloat.per_partition(4) is None  # not measured: unbounded
    debloat.observe(100_000, 0.5)
    assert debloat.rate == 200_000
    assert debloat.budget == 100_000 and debloat.per_partition(4) == 25_000
    debloat.observe(0, 0.1)  # a round without records says nothing of the rate
    debloat.observe(40_000, 1.0)  # nor one with less than half the budget: it waited for input
    assert debloat.rate == 200_000
    debloat.observe(60_000, 600.0)  # a very slow round: the bound has a floor
    assert debloat.rate == 100 and debloat.per_partition(4) == MIN_RECORDS_PER_PARTITION


def test_the_rate_is_averaged_over_the_samples() -> None:
    debloat = Debloater(target_ms=1_000, samples=3)  # weight 2 / (3 + 1)
    debloat.observe(1_000, 1.0)
    debloat.observe(3_000, 1.0)
    assert debloat.rate == pytest.approx(2_000)
    debloat.observe(2_000, 1.0)
    assert debloat.rate == pytest.approx(2_000)


def test_debloating_is_off_by_default_and_its_options_are_checked() -> None:
    assert not CheckpointConfig().buffer_debloat
    config = CheckpointConfig.from_options(
        {DEBLOAT + "enabled": "true", DEBLOAT + "target": "300 ms", DEBLOAT + "samples": "5"}
    )
    assert config.buffer_debloat and config.buffer_debloat_target_ms == 300
    assert config.buffer_debloat_samples == 5
    with pytest.raises(ConfigError, match=r"buffer-debloat\.target"):
        CheckpointConfig.from_options({DEBLOAT + "target": "0 ms"})
    with pytest.raises(ConfigError, match=r"buffer-debloat\.samples"):
        CheckpointConfig.from_options({DEBLOAT + "samples": "0"})
