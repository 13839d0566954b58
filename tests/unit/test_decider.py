"""The request decider, with Flink's CheckpointRequestDeciderTest expectations ported."""

from __future__ import annotations

import enum

import pytest

from sparkpoint.common.events import CheckpointFailureReason, SnapshotType
from sparkpoint.coordinator.core.decider import CheckpointRequest, RequestDecider

NOW = 86_400_000  # a day in, like Flink's test clock
PAUSE = 10


class Expect(enum.Enum):
    IMMEDIATELY = "IMMEDIATELY"
    AFTER_PAUSE = "AFTER_PAUSE"
    DROPPED = "DROPPED"


def periodic_checkpoint(at: int = NOW) -> CheckpointRequest:
    return CheckpointRequest(SnapshotType.CHECKPOINT, periodic=True, timestamp_ms=at)


def manual_checkpoint(at: int = NOW, request_id: str = "manual") -> CheckpointRequest:
    return CheckpointRequest(
        SnapshotType.CHECKPOINT, periodic=False, timestamp_ms=at, request_id=request_id
    )


def forced_checkpoint(at: int = NOW) -> CheckpointRequest:
    return CheckpointRequest(SnapshotType.CHECKPOINT, periodic=False, timestamp_ms=at, forced=True)


def savepoint(at: int = NOW) -> CheckpointRequest:
    return CheckpointRequest(
        SnapshotType.SAVEPOINT, periodic=False, timestamp_ms=at, request_id="sp"
    )


def periodic_savepoint(at: int = NOW) -> CheckpointRequest:
    return CheckpointRequest(SnapshotType.SAVEPOINT, periodic=True, timestamp_ms=at)


@pytest.mark.parametrize(
    ("request_factory", "expected"),
    [
        (savepoint, Expect.IMMEDIATELY),
        (periodic_savepoint, Expect.IMMEDIATELY),
        (forced_checkpoint, Expect.IMMEDIATELY),
        (manual_checkpoint, Expect.IMMEDIATELY),
        (periodic_checkpoint, Expect.DROPPED),
    ],
    ids=lambda v: getattr(v, "__name__", getattr(v, "value", str(v))),
)
def test_timing_right_after_a_checkpoint_ended(request_factory: object, expected: Expect) -> None:
    """Flink's testSavepointTiming / testCheckpointTiming: the last checkpoint ended just now and
    the min pause is 10 ms."""
    decider = RequestDecider(max_concurrent=1, min_pause_ms=PAUSE)
    request = request_factory()  # type: ignore[operator]
    decision = decider.submit(request, pending=0, last_completion_ms=NOW, now_ms=NOW)

    if expected is Expect.IMMEDIATELY:
        assert decision.execute is request
    elif expected is Expect.AFTER_PAUSE:
        assert decision.execute is None
        later = decider.choose_queued(pending=0, last_completion_ms=NOW, now_ms=NOW + PAUSE)
        assert later.execute is request
    else:
        assert decision.execute is None
        assert decision.dropped == [
            (request, CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
        ]
        assert decision.reschedule_periodic_in_ms == PAUSE


def test_a_periodic_checkpoint_after_the_pause_runs() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=PAUSE)
    request = periodic_checkpoint(NOW + PAUSE)
    assert decider.submit(request, 0, NOW, NOW + PAUSE).execute is request


def test_a_periodic_checkpoint_with_no_previous_checkpoint_runs() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=PAUSE)
    request = periodic_checkpoint()
    assert decider.submit(request, 0, None, NOW).execute is request


def test_over_max_concurrent_a_periodic_request_is_dropped() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0)
    request = periodic_checkpoint()
    decision = decider.submit(request, pending=1, last_completion_ms=None, now_ms=NOW)
    assert decision.execute is None
    assert decision.dropped == [(request, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert decider.queued == 0


def test_over_max_concurrent_a_manual_request_waits_for_a_slot() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0)
    request = manual_checkpoint()
    assert decider.submit(request, pending=1, last_completion_ms=None, now_ms=NOW).execute is None
    assert decider.choose_queued(pending=1, last_completion_ms=None, now_ms=NOW).execute is None
    assert decider.choose_queued(pending=0, last_completion_ms=None, now_ms=NOW).execute is request


@pytest.mark.parametrize("factory", [savepoint, periodic_savepoint, forced_checkpoint])
def test_over_max_concurrent_a_forced_request_goes_through(factory: object) -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=PAUSE)
    request = factory()  # type: ignore[operator]
    assert decider.submit(request, pending=5, last_completion_ms=NOW, now_ms=NOW).execute is request


@pytest.mark.parametrize(
    ("queued", "expected_order"),
    [
        (
            ["periodic_savepoint", "savepoint"],
            ["savepoint", "periodic_savepoint"],
        ),  # user before periodic
        (["manual", "savepoint"], ["savepoint", "manual"]),  # savepoint before checkpoint
        (["periodic", "manual"], ["manual", "periodic"]),  # manual before periodic
        (["manual", "forced"], ["forced", "manual"]),  # forced before not forced
        (["manual-old", "manual-new"], ["manual-old", "manual-new"]),  # older first
    ],
)
def test_queue_order(queued: list[str], expected_order: list[str]) -> None:
    factories = {
        "periodic_savepoint": lambda: periodic_savepoint(NOW),
        "savepoint": lambda: savepoint(NOW + 1),
        "manual": lambda: manual_checkpoint(NOW + 2),
        "periodic": lambda: periodic_checkpoint(NOW),
        "forced": lambda: forced_checkpoint(NOW + 3),
        "manual-old": lambda: manual_checkpoint(NOW),
        "manual-new": lambda: manual_checkpoint(NOW + 5),
    }
    requests = {name: factories[name]() for name in queued}
    ordered = sorted(requests.values(), key=CheckpointRequest.priority)
    assert [next(n for n, r in requests.items() if r is o) for o in ordered] == expected_order


def test_waiting_requests_run_in_queue_order() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0)
    later, earlier = manual_checkpoint(NOW + 5, "later"), manual_checkpoint(NOW, "earlier")
    decider.submit(later, 1, None, NOW + 5)
    decider.submit(earlier, 1, None, NOW + 5)
    assert decider.choose_queued(0, None, NOW + 5).execute is earlier
    assert decider.choose_queued(0, None, NOW + 5).execute is later


def test_queue_bound_evicts_periodic_first() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0, max_queued=2)
    periodic = periodic_checkpoint()
    manual_a, manual_b = manual_checkpoint(NOW + 1, "a"), manual_checkpoint(NOW + 2, "b")
    # pending=1: the manual request waits, and the periodic one waits behind it
    assert decider.submit(manual_a, 1, None, NOW).execute is None
    assert decider.submit(periodic, 1, None, NOW).dropped == []
    evicted = decider.submit(manual_b, 1, None, NOW)
    assert (periodic, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS) in evicted.dropped
    assert decider.queued == 2


def test_a_full_queue_of_manual_requests_drops_the_new_one() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0, max_queued=2)
    for i in range(2):
        decider.submit(manual_checkpoint(NOW + i, f"m{i}"), 1, None, NOW)
    newest = manual_checkpoint(NOW + 9, "newest")
    decision = decider.submit(newest, 1, None, NOW)
    assert decision.dropped == [(newest, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert decider.queued == 2


def test_abort_all_empties_the_queue() -> None:
    decider = RequestDecider(max_concurrent=1, min_pause_ms=0)
    queued = [manual_checkpoint(NOW + i, str(i)) for i in range(3)]
    for request in queued:
        decider.submit(request, 1, None, NOW)
    assert decider.abort_all() == queued
    assert decider.queued == 0
