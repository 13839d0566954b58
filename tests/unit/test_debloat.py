"""Buffer debloating for rounds (services/sparkpoint/agent/rounds/debloat.py), pure: a round's
fixed cost and cost per record fitted to busy rounds, the bound they give, its share per
partition by backlog; its options."""

from __future__ import annotations

import logging

import pytest

from sparkpoint.agent.rounds.debloat import MIN_RECORDS_PER_PARTITION, Debloater
from sparkpoint.common.settings import CheckpointConfig, ConfigError

DEBLOAT = "taskmanager.network.memory.buffer-debloat."


def test_a_round_reads_what_fits_in_the_target_after_its_fixed_cost() -> None:
    debloat = Debloater(target_ms=500)
    assert debloat.budget is None and debloat.bounds({("t", 0): 10}) == {}  # nothing measured
    debloat.observe(10_000, 1.0, busy=True)  # one size of round: scaled to the target
    assert debloat.budget == 5_000
    debloat.observe(30_000, 0.7, busy=False)  # waited for input: says nothing
    debloat.observe(0, 0.2, busy=True)
    assert debloat.budget == 5_000
    debloat.rounds.clear()
    debloat.observe(10_000, 0.3, busy=True)  # 0.1 s fixed, 20 µs a record
    debloat.observe(30_000, 0.7, busy=True)
    fixed, per_record = debloat.fit() or (0.0, 0.0)
    assert fixed == pytest.approx(0.1) and per_record == pytest.approx(2e-5)
    assert debloat.budget == pytest.approx(20_000, abs=1)  # (0.5 - 0.1) / 2e-5


def test_a_target_below_the_fixed_cost_leaves_reads_unbounded_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reading less cannot bring a round under its fixed cost: bounding it would only shrink
    the reads until the job crawls."""
    debloat = Debloater(target_ms=200)
    debloat.observe(10_000, 0.5, busy=True)  # 0.4 s fixed
    with caplog.at_level(logging.WARNING, logger="sparkpoint.agent.rounds.debloat"):
        debloat.observe(20_000, 0.6, busy=True)
        assert debloat.budget is None and debloat.unreachable
        assert debloat.bounds({("t", 0): 50_000}) == {}
    assert "fixed cost (400 ms) is at or above the target (200 ms)" in caplog.text


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
