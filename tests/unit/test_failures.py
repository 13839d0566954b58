"""The failure manager: Flink's counted/ignored table, once per id, reset on success."""

from __future__ import annotations

import pytest

from sparkpoint.common.events import CheckpointFailureReason as Reason
from sparkpoint.coordinator.core.failures import (
    COUNTED,
    FailureManager,
    UnknownFailureReason,
    is_counted,
)

FLINK_COUNTED = {
    Reason.IO_EXCEPTION,
    Reason.CHECKPOINT_ASYNC_EXCEPTION,
    Reason.CHECKPOINT_DECLINED,
    Reason.CHECKPOINT_EXPIRED,
    Reason.FINALIZE_CHECKPOINT_FAILURE,
}


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: r.name)
def test_each_reason_is_counted_exactly_as_flink_counts_it(reason: Reason) -> None:
    assert is_counted(reason) is (reason in FLINK_COUNTED)


def test_the_table_covers_every_reason() -> None:
    assert set(COUNTED) == set(Reason)


def test_an_unknown_reason_is_an_error() -> None:
    with pytest.raises(UnknownFailureReason):
        is_counted("CHECKPOINT_EXPIRED")  # type: ignore[arg-type]


def test_more_than_tolerable_consecutive_failures_request_a_failover() -> None:
    manager = FailureManager(tolerable=2)
    assert manager.on_failure(1, Reason.CHECKPOINT_EXPIRED, False) is None
    assert manager.on_failure(2, Reason.CHECKPOINT_DECLINED, False) is None
    decision = manager.on_failure(3, Reason.IO_EXCEPTION, False)
    assert decision is not None
    assert (decision.checkpoint_id, decision.reason, decision.consecutive_failures) == (
        3,
        Reason.IO_EXCEPTION,
        3,
    )
    assert manager.consecutive_failures == 0  # counting starts again after the failover


def test_zero_tolerable_fails_over_on_the_first_counted_failure() -> None:
    assert FailureManager(tolerable=0).on_failure(1, Reason.CHECKPOINT_EXPIRED, False) is not None


def test_ignored_reasons_do_not_count() -> None:
    manager = FailureManager(tolerable=0)
    for checkpoint_id, reason in enumerate(
        [
            Reason.CHECKPOINT_SUBSUMED,
            Reason.TOO_MANY_CHECKPOINT_REQUESTS,
            Reason.CHECKPOINT_DECLINED_TASK_NOT_READY,
        ],
        1,
    ):
        assert manager.on_failure(checkpoint_id, reason, False) is None
    assert manager.consecutive_failures == 0


def test_each_checkpoint_id_counts_once() -> None:
    manager = FailureManager(tolerable=1)
    manager.on_failure(5, Reason.CHECKPOINT_DECLINED, False)
    assert manager.on_failure(5, Reason.CHECKPOINT_EXPIRED, False) is None
    assert manager.consecutive_failures == 1


def test_only_checkpoints_newer_than_the_last_success_count() -> None:
    manager = FailureManager(tolerable=0)
    manager.on_success(10)
    assert manager.on_failure(9, Reason.CHECKPOINT_EXPIRED, False) is None
    assert manager.on_failure(11, Reason.CHECKPOINT_EXPIRED, False) is not None


def test_a_success_resets_the_count() -> None:
    manager = FailureManager(tolerable=1)
    manager.on_failure(1, Reason.CHECKPOINT_EXPIRED, False)
    manager.on_success(2)
    assert manager.on_failure(3, Reason.CHECKPOINT_EXPIRED, False) is None
    assert manager.consecutive_failures == 1


def test_savepoint_failures_never_count() -> None:
    manager = FailureManager(tolerable=0)
    assert manager.on_failure(1, Reason.CHECKPOINT_EXPIRED, True) is None
    assert manager.consecutive_failures == 0


def test_lowering_the_threshold_below_the_count_fails_over_at_once() -> None:
    manager = FailureManager(tolerable=5)
    for checkpoint_id in (1, 2, 3):
        manager.on_failure(checkpoint_id, Reason.CHECKPOINT_EXPIRED, False)
    assert manager.set_tolerable(3) is None
    decision = manager.set_tolerable(2)
    assert (
        decision is not None and decision.checkpoint_id == 3 and decision.consecutive_failures == 3
    )
