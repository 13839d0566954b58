"""Buffer debloating for rounds (services/sparkpoint/agent/rounds/debloat.py), pure: the rate of
busy rounds in source records, the bound it gives and its floor, its share per partition by
backlog; its options."""

from __future__ import annotations

import pytest

from sparkpoint.agent.rounds.debloat import MIN_RECORDS_PER_PARTITION, Debloater
from sparkpoint.common.settings import CheckpointConfig, ConfigError

DEBLOAT = "taskmanager.network.memory.buffer-debloat."


def test_a_round_reads_what_busy_rounds_process_in_the_target_time() -> None:
    debloat = Debloater(target_ms=500, samples=1)  # the rate follows the last busy round
    assert debloat.budget is None and debloat.bounds({("t", 0): 10}) == {}  # nothing measured
    debloat.observe(100_000, 0.5, busy=True)
    assert debloat.rate == 200_000 and debloat.budget == 100_000
    debloat.observe(1_000, 1.0, busy=False)  # waited for input: says nothing
    debloat.observe(0, 0.2, busy=True)
    assert debloat.rate == 200_000


def test_the_bound_never_falls_below_a_quarter_of_the_largest_round() -> None:
    """A round's fixed cost stays when reads shrink: each shrink would lower the measured rate
    again, down to nothing, with a target near that cost."""
    debloat = Debloater(target_ms=200, samples=1)
    debloat.observe(40_000, 1.0, busy=True)  # 40,000 a second: 8,000 in 200 ms
    assert debloat.budget == 10_000  # a quarter of 40,000
    debloat.observe(10_000, 0.45, busy=True)  # mostly fixed cost
    assert debloat.budget == 10_000


def test_the_rate_is_averaged_over_the_samples() -> None:
    debloat = Debloater(target_ms=1_000, samples=3)  # weight 2 / (3 + 1)
    debloat.observe(1_000, 1.0, busy=True)
    debloat.observe(3_000, 1.0, busy=True)
    assert debloat.rate == pytest.approx(2_000)


def test_rows_are_counted_as_source_records_through_the_jobs_map() -> None:
    debloat = Debloater(target_ms=1_000, samples=1)  # the ratio follows the last read
    debloat.read(records=1_000, rows=100)  # the map keeps a tenth
    debloat.observe(1_000, 1.0, busy=True)  # 1,000 rows: 10,000 records a second
    assert debloat.budget == 10_000


def test_the_budget_is_shared_by_backlog() -> None:
    debloat = Debloater(target_ms=1_000)
    debloat.observe(20_000, 1.0, busy=True)
    hot, cold, unknown, tiny = ("t", 0), ("t", 1), ("t", 2), ("t", 3)
    shares = debloat.bounds({hot: 90_000, cold: 10_000, unknown: None, tiny: 1})
    assert shares[hot] == shares[unknown] == 20_000 * 90_000 // 190_001  # unknown: the largest
    assert shares[cold] == 20_000 * 10_000 // 190_001
    assert shares[tiny] == MIN_RECORDS_PER_PARTITION  # never below the floor


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
