"""Folding override records: highest version wins, tombstones remove, duplicates, reordering
and gaps are harmless."""

from __future__ import annotations

from sparkpoint.common.events import CheckpointOverrides, CheckpointSettings
from sparkpoint.common.kafka import Received
from sparkpoint.overrides.store import fold

T0 = 1_790_000_000_000


def record(offset: int, job_id: str, version: int | None, timeout_ms: int = 1000) -> Received:
    event = None
    if version is not None:
        event = CheckpointOverrides(
            job_id, version, CheckpointSettings(checkpoint_timeout_ms=timeout_ms), f"r{version}", T0
        )
    return Received("overrides", 0, offset, job_id, T0, event)


def test_the_highest_version_wins() -> None:
    folded = fold([record(0, "a", 1), record(1, "a", 2, 2000), record(2, "b", 1)])
    assert {job: o.version for job, o in folded.items()} == {"a": 2, "b": 1}
    assert folded["a"].overrides.checkpoint_timeout_ms == 2000


def test_duplicates_and_late_lower_versions_are_ignored() -> None:
    folded = fold([record(0, "a", 3, 3000), record(1, "a", 3, 3000), record(2, "a", 2, 2000)])
    assert folded["a"].version == 3 and folded["a"].overrides.checkpoint_timeout_ms == 3000


def test_gaps_in_versions_are_fine() -> None:
    assert fold([record(0, "a", 1), record(1, "a", 7)])["a"].version == 7


def test_a_tombstone_removes_the_job_and_a_new_job_starts_again() -> None:
    assert fold([record(0, "a", 5), record(1, "a", None)]) == {}
    assert fold([record(0, "a", 5), record(1, "a", None), record(2, "a", 1)])["a"].version == 1


def test_a_record_whose_key_is_not_its_job_is_skipped() -> None:
    mismatched = Received("overrides", 0, 0, "b", T0, record(0, "a", 1).event)
    assert fold([mismatched]) == {}
