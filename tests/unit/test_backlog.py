"""Processing backlog (FLIP-309) for a source (services/sparkpoint/agent/sources/backlog.py),
pure: what is behind at the start, when it is over (once, for good), and how a round's bounds
grow while it is read and hold when the job set them."""

from __future__ import annotations

import pytest

from sparkpoint.agent.job import FileSource, KafkaSource
from sparkpoint.agent.sources.backlog import (
    CATCHING_UP,
    FIRST,
    LIVE,
    Backlog,
    BacklogReports,
    RoundBounds,
)

A, B = ("t", 0), ("t", 1)


def test_the_records_a_partition_held_at_the_start_are_its_backlog() -> None:
    backlog = Backlog()
    backlog.start({A: 100, B: 500}, {A: 400, B: 500})  # B starts at its end
    assert backlog.until == {A: 400}
    assert backlog.processing({A: 100, B: 500})
    assert backlog.processing({A: 399, B: 900})  # B's new records are not backlog
    assert not backlog.processing({A: 400, B: 900})


def test_once_the_backlog_is_read_it_is_over_for_good() -> None:
    backlog = Backlog()
    backlog.start({A: 0}, {A: 10})
    assert not backlog.processing({A: 10})
    assert not backlog.processing({A: 3})  # positions never go back in an attempt; still over
    backlog.start({A: 3}, {A: 50})  # a restart from a checkpoint: behind again
    assert backlog.processing({A: 3})


def test_a_start_at_the_end_has_no_backlog() -> None:
    backlog = Backlog()
    backlog.start({A: 0, B: 7}, {A: 0, B: 7})
    assert not backlog.processing({A: 0, B: 7})
    assert backlog.bounds({A: 0, B: 7}, None, None) == LIVE


def test_default_bounds_start_short_then_double_each_round_of_backlog_up_to_catching_up() -> None:
    """Two short rounds first: the second processes what the first read (the first output)."""
    backlog = Backlog()
    backlog.start({A: 0}, {A: 10_000_000})
    grown = [backlog.bounds({A: 0}, None, None) for _ in range(6)]
    assert grown == [
        FIRST,
        FIRST,
        RoundBounds(100_000, 400),
        RoundBounds(200_000, 800),
        CATCHING_UP,
        CATCHING_UP,
    ]
    assert backlog.bounds({A: 10_000_000}, None, None) == LIVE  # read: live bounds again


def test_bounds_a_job_sets_hold_in_every_phase() -> None:
    backlog = Backlog()
    backlog.start({A: 0}, {A: 10_000_000})
    for _ in range(6):
        assert backlog.bounds({A: 0}, 25, 50) == RoundBounds(25, 50)
    # one set, the other left to the phase
    assert backlog.bounds({A: 0}, 25, None) == RoundBounds(25, CATCHING_UP.duration_ms)


def test_sources_leave_their_bounds_to_the_phase_unless_set() -> None:
    source = KafkaSource(["t"])
    assert source.max_records_per_partition is None and source.duration_bound_ms is None
    assert source.max_duration_ms == LIVE.duration_ms
    assert KafkaSource(["t"], max_duration_per_trigger="2s").duration_bound_ms == 2_000
    with pytest.raises(ValueError, match="max_records_per_partition"):
        KafkaSource(["t"], max_records_per_partition=0)
    with pytest.raises(ValueError, match="max_records_per_partition"):
        FileSource("/tmp/x.parquet", max_records_per_partition=0)


def test_the_coordinator_is_told_each_change_and_a_new_owner_the_backlog_again() -> None:
    reports = BacklogReports(owner_epoch=3)  # registered: the coordinator knows of no backlog
    assert not reports.news(False, 3)
    assert reports.news(True, 3)
    assert not reports.news(True, 3)
    assert reports.news(True, 4)  # another coordinator took the job over: it starts without
    assert not reports.news(True, 4)
    assert reports.news(False, 4)
    assert not reports.news(False, 5)  # a takeover after the backlog: nothing to tell
