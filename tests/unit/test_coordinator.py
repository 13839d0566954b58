"""The checkpoint coordinator of one job, driven on a manual clock."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from sparkpoint.common.clock import ManualClock
from sparkpoint.common.events import CheckpointFailureReason as Reason
from sparkpoint.common.events import JobStatus, NotifyCheckpointAborted, SnapshotType
from sparkpoint.common.settings import CheckpointConfig, ExternalizedRetention
from sparkpoint.coordinator.core.commands import RequestCompleted, RequestFailed
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.core.pending import AckResult
from sparkpoint.coordinator.core.store import CompletedCheckpoint
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter
from tests.unit.harness import (
    JOB_DIR,
    JOB_ID,
    T0,
    Driver,
    ack,
    coordinator,
    decline,
    shared,
    subtasks,
)

MIN = 60_000
SECOND = 1000


def config(**changes: object) -> CheckpointConfig:
    defaults: dict[str, object] = {"interval_ms": 1000, "timeout_ms": 10_000}
    return CheckpointConfig(**(defaults | changes))  # type: ignore[arg-type]


def triggered(driver: Driver) -> int:
    """Advance to the next trigger and return its checkpoint id."""
    before = len(driver.triggers())
    for _ in range(100):
        due = driver.timers.next_due_ms()
        if due is None:
            break
        driver.advance(due - driver.now)
        if len(driver.triggers()) > before:
            return driver.last_trigger_id()
    raise AssertionError("no trigger")


# --- periodic scheduling ---------------------------------------------------------------------------


def test_the_first_trigger_comes_after_a_random_delay_between_min_pause_and_interval() -> None:
    firsts = set()
    for seed in range(200):
        driver = coordinator(config(interval_ms=1000, min_pause_ms=200), seed=seed)
        driver.advance(1000)
        firsts.add(driver.trigger_times()[0] - T0)
    assert min(firsts) >= 200 and max(firsts) <= 1000
    assert len(firsts) > 100  # spread, not one fixed delay


def test_the_random_delay_is_seedable() -> None:
    def first(seed: int) -> int:
        driver = coordinator(config(interval_ms=10_000), seed=seed)
        driver.advance(10_000)
        return driver.trigger_times()[0]

    assert first(3) == first(3)
    assert len({first(s) for s in range(10)}) > 1


def test_periodic_triggers_are_one_interval_apart() -> None:
    driver = coordinator(config(interval_ms=1000))
    first = triggered(driver)
    driver.acknowledge_all(first)
    for _ in range(3):
        driver.advance(1000)
        driver.acknowledge_all(driver.last_trigger_id())
    times = driver.trigger_times()
    assert [b - a for a, b in itertools.pairwise(times)] == [1000, 1000, 1000]


def test_it_re_arms_from_a_stored_next_trigger_time() -> None:
    core = CheckpointCoordinator(
        JobInfo(JOB_ID, subtasks(2)), config(), InMemoryCheckpointIdCounter()
    )
    driver = Driver(core, ManualClock(T0)).start(next_trigger_ms=T0 + 321)
    driver.advance(1000)
    assert driver.trigger_times()[0] == T0 + 321


def test_no_interval_means_no_periodic_checkpoint_but_savepoints_work() -> None:
    driver = coordinator(CheckpointConfig())
    driver.advance(60_000)
    assert driver.triggers() == []
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "sp-1"))
    assert [t.snapshot_type for t in driver.triggers()] == [SnapshotType.SAVEPOINT]


def test_stop_with_savepoint_suspends_and_with_drain_terminates_as_flinks_stop() -> None:
    driver = coordinator(CheckpointConfig())
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "stop", terminate=True))
    driver.acknowledge_all(driver.triggers()[-1].checkpoint_id)
    driver.run(
        driver.coordinator.trigger_savepoint(driver.now, "drain", terminate=True, drain=True)
    )
    assert [t.snapshot_type for t in driver.triggers()] == [
        SnapshotType.SAVEPOINT_SUSPEND,
        SnapshotType.SAVEPOINT_TERMINATE,
    ]


# --- acknowledgements and completion ---------------------------------------------------------------


def test_a_checkpoint_completes_only_when_every_subtask_acknowledged() -> None:
    driver = coordinator(config(), parallelism=3)
    checkpoint_id = triggered(driver)
    driver.acknowledge_all(checkpoint_id, only=["keyed-0", "keyed-2"])
    assert driver.completed() == []
    driver.acknowledge(ack(checkpoint_id, "keyed-1"))
    assert driver.completed() == [checkpoint_id]
    assert (
        driver.lifecycle()[-2:] == [(checkpoint_id, "COMPLETED")]
        or (checkpoint_id, "COMPLETED") in driver.lifecycle()
    )


def test_acknowledge_results() -> None:
    driver = coordinator(config(), parallelism=2)
    checkpoint_id = triggered(driver)
    assert driver.acknowledge(ack(checkpoint_id, "keyed-0")) is AckResult.SUCCESS
    assert driver.acknowledge(ack(checkpoint_id, "keyed-0")) is AckResult.DUPLICATE
    assert driver.acknowledge(ack(checkpoint_id, "keyed-9", [shared("stray")])) is AckResult.REFUSED
    assert driver.acknowledge(ack(999, "keyed-0", [shared("unknown")])) is AckResult.REFUSED
    assert driver.discarded_files() == []  # refused acknowledgements delete nothing
    assert driver.completed() == []


def driven_by(agent_id: str, attempt: int, **changes: object) -> Driver:
    """A started coordinator whose job is driven by ``agent_id`` at ``attempt``."""
    core = CheckpointCoordinator(
        JobInfo(JOB_ID, subtasks(2), agent_id, attempt),
        config(**changes),
        InMemoryCheckpointIdCounter(),
        random.Random(7),
    )
    return Driver(core, ManualClock(T0)).start()


def test_acknowledgements_of_another_agent_or_attempt_are_refused_and_delete_nothing() -> None:
    driver = driven_by("agent-a", 3)
    checkpoint_id = triggered(driver)
    stale = dataclasses.replace(
        ack(checkpoint_id, "keyed-0", [shared("x")]), agent_id="agent-a", attempt=2
    )
    other = dataclasses.replace(
        ack(checkpoint_id, "keyed-0", [shared("y")]), agent_id="agent-b", attempt=3
    )
    assert driver.acknowledge(stale) is AckResult.REFUSED
    assert driver.acknowledge(other) is AckResult.REFUSED
    assert driver.discarded_files() == []
    holders = [r for r in driver.refusals if r]
    assert "agent-a attempt 3" in holders[0]
    for subtask in ("keyed-0", "keyed-1"):
        good = dataclasses.replace(ack(checkpoint_id, subtask), agent_id="agent-a", attempt=3)
        assert driver.acknowledge(good) is AckResult.SUCCESS
    assert driver.completed() == [checkpoint_id]


def test_declines_of_another_attempt_abort_nothing() -> None:
    driver = driven_by("agent-a", 3)
    checkpoint_id = triggered(driver)
    driver.decline(
        dataclasses.replace(decline(checkpoint_id, "keyed-0"), agent_id="agent-a", attempt=1)
    )
    assert driver.aborted() == []


def test_control_events_are_addressed_to_the_agent_and_attempt_that_drive_the_job() -> None:
    driver = driven_by("agent-a", 3, timeout_ms=500)
    checkpoint_id = triggered(driver)
    driver.advance(500)  # expires: an abort notification
    trigger = driver.triggers()[0]
    (aborted,) = driver.events(NotifyCheckpointAborted)
    assert (trigger.agent_id, trigger.attempt) == ("agent-a", 3)
    assert (aborted.checkpoint_id, aborted.agent_id, aborted.attempt) == (
        checkpoint_id,
        "agent-a",
        3,
    )


def test_a_late_acknowledgement_never_deletes_a_file_a_retained_checkpoint_references() -> None:
    driver = coordinator(config(timeout_ms=5000))
    kept = triggered(driver)
    driver.acknowledge_all(kept, files=[shared("base")])  # completed and retained
    late = triggered(driver)
    driver.advance(5000)  # expires
    assert (late, Reason.CHECKPOINT_EXPIRED) in driver.aborted()
    result = driver.acknowledge(ack(late, "keyed-0", [shared("base"), shared("mine")]))
    assert result is AckResult.DISCARDED
    assert shared("mine") in driver.discarded_files()
    assert shared("base") not in driver.discarded_files()


def test_the_store_record_names_the_holder_and_the_newest_completed_checkpoint() -> None:
    driver = driven_by("agent-a", 3)
    first = triggered(driver)
    for subtask in ("keyed-0", "keyed-1"):
        driver.acknowledge(dataclasses.replace(ack(first, subtask), agent_id="agent-a", attempt=3))
    record = driver.coordinator.store_record(driver.now)
    assert (record.agent_id, record.attempt) == ("agent-a", 3)
    assert record.last_completed_checkpoint_id == first
    assert record.job_status == "RUNNING"
    driver.run(driver.coordinator.shutdown(JobStatus.FINISHED, driver.now))
    ended = driver.coordinator.store_record(driver.now)
    assert ended.retained == [] and ended.last_completed_checkpoint_id == first
    assert (ended.job_status, ended.externalized_retention) == (
        "FINISHED",
        "NO_EXTERNALIZED_CHECKPOINTS",
    )


def test_a_late_acknowledgement_of_an_expired_checkpoint_is_discarded_quietly() -> None:
    driver = coordinator(config(timeout_ms=5000), parallelism=2)
    checkpoint_id = triggered(driver)
    driver.advance(5000)
    assert driver.aborted() == [(checkpoint_id, Reason.CHECKPOINT_EXPIRED)]
    assert (
        driver.acknowledge(ack(checkpoint_id, "keyed-0", [shared("late")])) is AckResult.DISCARDED
    )
    assert shared("late") in driver.discarded_files()
    assert checkpoint_id not in driver.completed()


def test_completion_publishes_notify_lifecycle_and_store_record() -> None:
    from sparkpoint.common.events import CheckpointStoreRecord, NotifyCheckpointComplete

    driver = coordinator(config())
    checkpoint_id = triggered(driver)
    driver.acknowledge_all(checkpoint_id)
    notify = driver.events(NotifyCheckpointComplete)[-1]
    store = driver.events(CheckpointStoreRecord)[-1]
    assert notify.external_path == f"{JOB_DIR}/chk-{checkpoint_id}"  # absolute, wherever it runs
    assert [r.checkpoint_id for r in store.retained] == [checkpoint_id]
    assert store.checkpoint_id_counter == checkpoint_id + 1


def test_a_completed_checkpoint_subsumes_older_pending_checkpoints_but_not_savepoints() -> None:
    driver = coordinator(config(max_concurrent=3, interval_ms=1000))
    first = triggered(driver)
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "sp"))
    savepoint_id = driver.last_trigger_id()
    driver.advance(1000)
    third = driver.last_trigger_id()
    driver.acknowledge_all(third)
    assert (first, Reason.CHECKPOINT_SUBSUMED) in driver.aborted()
    assert savepoint_id in driver.coordinator.pending
    assert (first, "SUBSUMED") in driver.lifecycle()


def test_ids_strictly_increase_across_checkpoints_and_savepoints() -> None:
    driver = coordinator(config(max_concurrent=2))
    for _ in range(5):
        checkpoint_id = triggered(driver)
        driver.run(driver.coordinator.trigger_savepoint(driver.now))
        driver.acknowledge_all(checkpoint_id)
    ids = [t.checkpoint_id for t in driver.triggers()]
    assert ids == sorted(set(ids)) and ids[0] == 1


# --- timeouts (FLIP-571) ----------------------------------------------------------------------------


def test_an_unacknowledged_checkpoint_expires_at_its_timeout() -> None:
    driver = coordinator(config(timeout_ms=5000, interval_ms=60_000))
    checkpoint_id = triggered(driver)
    trigger = driver.now
    driver.advance(4999)
    assert driver.aborted() == []
    driver.advance(1)
    assert driver.aborted() == [(checkpoint_id, Reason.CHECKPOINT_EXPIRED)]
    assert driver.now == trigger + 5000
    assert (checkpoint_id, "EXPIRED") in driver.lifecycle()


def test_flip_571_extending_the_timeout_saves_a_nearly_done_checkpoint() -> None:
    """10 min -> 15 min with 10 s left: the checkpoint completes after the old deadline."""
    driver = coordinator(
        config(interval_ms=60 * MIN, timeout_ms=10 * MIN, tolerable_failed=0), parallelism=4
    )
    checkpoint_id = triggered(driver)
    trigger = driver.now
    driver.acknowledge_all(checkpoint_id, only=["keyed-0", "keyed-1", "keyed-2"])
    driver.advance(10 * MIN - 10 * SECOND)

    driver.configure(timeout_ms=15 * MIN)
    driver.advance(12 * SECOND)  # past the old deadline: 10 min 2 s after the trigger
    assert driver.aborted() == []
    driver.acknowledge(ack(checkpoint_id, "keyed-3", at=driver.now))

    assert driver.completed() == [checkpoint_id]
    assert driver.now - trigger == 10 * MIN + 2 * SECOND
    assert driver.failovers() == []


def test_flip_571_a_reduced_timeout_that_already_passed_aborts_at_once() -> None:
    driver = coordinator(config(interval_ms=60 * MIN, timeout_ms=10 * MIN))
    checkpoint_id = triggered(driver)
    driver.advance(5 * MIN)
    driver.configure(timeout_ms=3 * MIN)
    assert driver.aborted() == [(checkpoint_id, Reason.CHECKPOINT_EXPIRED)]


def test_a_reduced_timeout_still_in_the_future_moves_the_canceller_earlier() -> None:
    driver = coordinator(config(interval_ms=60 * MIN, timeout_ms=10 * MIN, tolerable_failed=5))
    checkpoint_id = triggered(driver)
    trigger = driver.now
    driver.advance(1 * MIN)
    driver.configure(timeout_ms=2 * MIN)
    driver.advance(MIN - 1)
    assert driver.aborted() == []
    driver.advance(1)
    assert driver.aborted() == [(checkpoint_id, Reason.CHECKPOINT_EXPIRED)]
    assert driver.now - trigger == 2 * MIN


# --- interval and min pause ----------------------------------------------------------------------------


def test_a_shorter_interval_moves_the_next_trigger_earlier() -> None:
    driver = coordinator(config(interval_ms=10_000))
    driver.acknowledge_all(triggered(driver))
    last = driver.now
    driver.advance(2000)
    driver.configure(interval_ms=5000)
    driver.advance(3000)
    assert driver.trigger_times()[-1] == last + 5000


def test_a_shorter_interval_whose_due_time_passed_triggers_at_once() -> None:
    driver = coordinator(config(interval_ms=10_000))
    driver.acknowledge_all(triggered(driver))
    driver.advance(7000)
    driver.configure(interval_ms=5000)
    assert driver.trigger_times()[-1] == driver.now
    assert len(driver.triggers()) == 2


def test_a_longer_interval_moves_the_next_trigger_later() -> None:
    driver = coordinator(config(interval_ms=10_000))
    driver.acknowledge_all(triggered(driver))
    last = driver.now
    driver.configure(interval_ms=30_000)
    driver.advance(29_999)
    assert len(driver.triggers()) == 1
    driver.advance(1)
    assert driver.trigger_times()[-1] == last + 30_000


def test_min_pause_drops_a_periodic_trigger_and_retries_when_the_pause_ends() -> None:
    driver = coordinator(config(interval_ms=1000, min_pause_ms=800, tolerable_failed=0))
    first = triggered(driver)
    driver.advance(700)
    driver.acknowledge_all(first)  # completes 700 ms after its trigger
    completion = driver.now
    driver.advance(1000)
    # the periodic trigger at +1000 came 300 ms after the completion: dropped, retried at +800
    assert driver.trigger_times()[-1] == completion + 800
    assert driver.failovers() == []  # a min-pause drop is not a failure


def test_a_longer_min_pause_postpones_a_waiting_retry() -> None:
    driver = coordinator(config(interval_ms=1000, min_pause_ms=800))
    first = triggered(driver)
    driver.advance(700)
    driver.acknowledge_all(first)
    completion = driver.now
    driver.advance(400)  # the periodic trigger was dropped; retry armed for completion + 800
    driver.configure(min_pause_ms=1500)
    driver.advance(2000)
    assert driver.trigger_times()[1] == completion + 1500


def test_at_max_concurrent_a_periodic_trigger_is_dropped_and_a_manual_one_waits() -> None:
    driver = coordinator(config(interval_ms=1000, timeout_ms=60_000))
    first = triggered(driver)
    driver.advance(1000)  # periodic trigger while 1 is pending: dropped
    assert len(driver.triggers()) == 1
    driver.run(driver.coordinator.trigger_checkpoint(driver.now, "manual-1"))
    assert len(driver.triggers()) == 1
    driver.acknowledge_all(first)
    assert driver.triggers()[-1].periodic is False
    assert len(driver.triggers()) == 2


def test_a_savepoint_goes_through_at_max_concurrent() -> None:
    driver = coordinator(config(interval_ms=1000, timeout_ms=60_000))
    triggered(driver)
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "sp", target_directory="/mnt/sp"))
    savepoint = driver.triggers()[-1]
    assert savepoint.snapshot_type is SnapshotType.SAVEPOINT
    assert savepoint.target_location.startswith(f"/mnt/sp/savepoint-{JOB_ID[:6]}-")
    assert len(driver.coordinator.pending) == 2


def test_raising_max_concurrent_lets_a_waiting_manual_checkpoint_run() -> None:
    driver = coordinator(config(interval_ms=60_000, timeout_ms=60_000))
    triggered(driver)
    driver.run(driver.coordinator.trigger_checkpoint(driver.now, "manual"))
    assert len(driver.triggers()) == 1
    driver.configure(max_concurrent=2)
    assert len(driver.triggers()) == 2


def test_backlog_switches_to_the_backlog_interval_and_zero_disables() -> None:
    driver = coordinator(config(interval_ms=1000, interval_during_backlog_ms=0))
    driver.acknowledge_all(triggered(driver))
    driver.run(driver.coordinator.set_backlog(True, driver.now))
    count = len(driver.triggers())
    driver.advance(10_000)
    assert len(driver.triggers()) == count
    driver.run(driver.coordinator.set_backlog(False, driver.now))
    driver.advance(1000)
    assert len(driver.triggers()) == count + 1


def test_backlog_reports_without_a_backlog_interval_move_no_trigger() -> None:
    """An agent reports backlog whether or not the job sets ``interval-during-backlog``; without
    it the interval stays, and a report must not push the next trigger back (a short job whose
    reports came before each trigger finished without a periodic checkpoint)."""
    driver = coordinator(config(interval_ms=1000))
    driver.acknowledge_all(triggered(driver))
    due = driver.trigger_times()[-1] + 1000
    driver.advance(600)
    assert driver.coordinator.set_backlog(True, driver.now) == []
    driver.advance(300)
    assert driver.coordinator.set_backlog(False, driver.now) == []
    driver.acknowledge_all(triggered(driver))
    assert driver.trigger_times()[-1] == due


def test_backlog_interval_is_used_while_backlogged() -> None:
    driver = coordinator(config(interval_ms=1000, interval_during_backlog_ms=5000))
    driver.run(driver.coordinator.set_backlog(True, driver.now))
    for _ in range(3):
        driver.acknowledge_all(triggered(driver))
    times = driver.trigger_times()
    assert [b - a for a, b in itertools.pairwise(times)] == [5000, 5000]


# --- declines, failures and failover ------------------------------------------------------------------


def test_a_decline_aborts_with_its_reason_and_a_counted_one_fails_over() -> None:
    driver = coordinator(config(tolerable_failed=0))
    completed = triggered(driver)
    driver.acknowledge_all(completed)
    driver.advance(1000)
    failing = driver.last_trigger_id()
    driver.decline(decline(failing, "keyed-1", Reason.CHECKPOINT_ASYNC_EXCEPTION))
    assert driver.aborted() == [(failing, Reason.CHECKPOINT_ASYNC_EXCEPTION)]
    (failover,) = driver.failovers()
    assert failover.restore_checkpoint_id == completed
    assert failover.failed_checkpoint_id == failing


def test_a_not_ready_decline_is_not_counted() -> None:
    driver = coordinator(config(tolerable_failed=0))
    driver.decline(decline(triggered(driver), "keyed-0", Reason.CHECKPOINT_DECLINED_TASK_NOT_READY))
    assert driver.failovers() == []


def test_tolerable_failures_are_tolerated() -> None:
    driver = coordinator(config(tolerable_failed=2, timeout_ms=500, interval_ms=1000))
    for _ in range(2):
        triggered(driver)
        driver.advance(500)
    assert driver.failovers() == []
    triggered(driver)
    driver.advance(500)
    assert len(driver.failovers()) == 1


def test_lowering_tolerable_failures_below_the_count_fails_over_now() -> None:
    driver = coordinator(config(tolerable_failed=5, timeout_ms=500, interval_ms=1000))
    for _ in range(3):
        triggered(driver)
        driver.advance(500)
    driver.configure(tolerable_failed=2)
    assert len(driver.failovers()) == 1


def test_a_failed_metadata_write_fails_the_checkpoint_and_counts() -> None:
    driver = coordinator(config(tolerable_failed=0))
    driver.auto_finalize = False
    checkpoint_id = triggered(driver)
    driver.acknowledge_all(checkpoint_id, files=[shared("x")])
    driver.run(driver.coordinator.on_finalize_failed(checkpoint_id, driver.now, "disk full"))
    assert driver.aborted() == [(checkpoint_id, Reason.FINALIZE_CHECKPOINT_FAILURE)]
    assert shared("x") in driver.discarded_files()
    assert len(driver.failovers()) == 1


def test_savepoint_failures_never_fail_over() -> None:
    driver = coordinator(config(interval_ms=None, tolerable_failed=0, timeout_ms=1000))
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "sp"))
    driver.advance(1000)
    assert driver.aborted()[0][1] is Reason.CHECKPOINT_EXPIRED
    assert driver.failovers() == []
    assert isinstance(driver.request_results()["sp"], RequestFailed)


# --- requests, savepoints, retention ---------------------------------------------------------------------


def test_a_manual_request_is_answered_with_the_checkpoint_path() -> None:
    driver = coordinator(config(interval_ms=None))
    driver.run(driver.coordinator.trigger_checkpoint(driver.now, "req-1"))
    driver.acknowledge_all(driver.last_trigger_id())
    result = driver.request_results()["req-1"]
    assert isinstance(result, RequestCompleted)
    assert result.external_path.endswith(f"/{JOB_ID}/chk-{result.checkpoint_id}")


def test_periodic_savepoints_are_bounded_and_manual_ones_kept() -> None:
    driver = coordinator(
        config(
            interval_ms=None,
            periodic_savepoint_interval_ms=10_000,
            periodic_savepoint_num_retained=2,
        )
    )
    driver.run(driver.coordinator.trigger_savepoint(driver.now, "manual"))
    manual = driver.triggers()[-1]
    driver.acknowledge_all(manual.checkpoint_id, files=[f"{manual.target_location}/state"])
    periodic = []
    for _ in range(4):
        driver.advance(10_000)
        trigger = driver.triggers()[-1]
        periodic.append(trigger)
        driver.acknowledge_all(trigger.checkpoint_id, files=[f"{trigger.target_location}/state"])
    discarded = driver.discarded_directories()
    assert discarded == [periodic[0].target_location, periodic[1].target_location]
    assert manual.target_location not in discarded
    assert f"{manual.target_location}/state" not in driver.discarded_files()


@pytest.mark.parametrize(
    ("retention", "status", "discards"),
    [
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.CANCELED, True),
        (ExternalizedRetention.RETAIN_ON_CANCELLATION, JobStatus.CANCELED, False),
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.FAILED, False),
    ],
)
def test_shutdown_applies_externalized_retention(
    retention: ExternalizedRetention, status: JobStatus, discards: bool
) -> None:
    driver = coordinator(config(externalized_retention=retention))
    checkpoint_id = triggered(driver)
    driver.acknowledge_all(checkpoint_id, files=[shared("a")])
    driver.advance(1000)
    pending = driver.last_trigger_id()
    driver.run(driver.coordinator.shutdown(status, driver.now))
    assert (pending, Reason.CHECKPOINT_COORDINATOR_SHUTDOWN) in driver.aborted()
    assert (shared("a") in driver.discarded_files()) is discards
    driver.advance(10_000)
    assert driver.last_trigger_id() == pending  # nothing triggers after shutdown


def test_restore_continues_the_ids_above_the_restored_checkpoint() -> None:
    core = CheckpointCoordinator(
        JobInfo(JOB_ID, subtasks(2)), config(), InMemoryCheckpointIdCounter(), random.Random(1)
    )
    retained = CompletedCheckpoint(
        41, SnapshotType.CHECKPOINT, True, T0 - 10, T0 - 5, "/cp/chk-41", 10, ("/cp/a",)
    )
    core.restore([retained], restored_ms=T0)
    driver = Driver(core, ManualClock(T0)).start()
    assert triggered(driver) == 42
    assert core.stats.to_json()["latest"]["restored"]["id"] == 41


# --- statistics -----------------------------------------------------------------------------------------


def test_statistics_in_flinks_shape() -> None:
    driver = coordinator(config(timeout_ms=900, tolerable_failed=10), parallelism=2)
    first = triggered(driver)
    driver.advance(30)
    driver.acknowledge_all(first)
    failing = triggered(driver)
    driver.advance(900)
    pending = triggered(driver)
    driver.acknowledge(ack(pending, "keyed-0", at=driver.now))

    stats = driver.coordinator.stats.to_json()

    assert stats["counts"] == {
        "restored": 0,
        "total": 3,
        "in_progress": 1,
        "completed": 1,
        "failed": 1,
    }
    assert stats["latest"]["completed"]["id"] == first
    assert stats["latest"]["completed"]["end_to_end_duration"] == 30
    assert stats["latest"]["failed"]["id"] == failing
    assert "CHECKPOINT_EXPIRED" in stats["latest"]["failed"]["failure_message"]
    assert [h["id"] for h in stats["history"]] == [pending, failing, first]
    assert [h["status"] for h in stats["history"]] == ["IN_PROGRESS", "FAILED", "COMPLETED"]
    assert stats["history"][0]["num_acknowledged_subtasks"] == 1
    assert set(stats["summary"]) == {
        "alignment_buffered",  # Flink 2.3 still answers it, always 0
        "state_size",
        "checkpointed_size",
        "end_to_end_duration",
        "processed_data",
        "persisted_data",
    }
    assert set(stats["summary"]["end_to_end_duration"]) == {
        "min",
        "max",
        "avg",
        "p50",
        "p90",
        "p95",
        "p99",
        "p999",
    }
    details = driver.coordinator.stats.details(pending)
    assert details is not None
    assert [s["status"] for s in details["subtasks"]] == ["completed", "pending_or_failed"]


def test_a_failover_request_stops_triggering_until_the_job_registers_again() -> None:
    driver = coordinator(config(tolerable_failed=0, timeout_ms=500, interval_ms=1000))
    kept = triggered(driver)
    driver.acknowledge_all(kept)
    triggered(driver)
    driver.advance(500)  # expires: a failover request naming the kept checkpoint
    (failover,) = driver.failovers()
    assert failover.restore_checkpoint_id == kept
    before = len(driver.triggers())
    driver.advance(10_000)
    assert len(driver.triggers()) == before, "nothing triggers while the job restarts"


def test_a_failover_aborts_checkpoints_in_flight_so_the_named_one_stays_the_latest() -> None:
    driver = coordinator(
        config(max_concurrent=2, tolerable_failed=0, timeout_ms=1500, interval_ms=1000)
    )
    kept = triggered(driver)
    driver.acknowledge_all(kept, files=[shared("a"), shared("b")])
    expiring = triggered(driver)
    driver.advance(1000)
    in_flight = driver.last_trigger_id()
    assert in_flight != expiring
    driver.acknowledge(ack(in_flight, "keyed-0", files=[shared("a")]))
    driver.advance(500)  # the first one expires: a failover naming the kept checkpoint
    (failover,) = driver.failovers()
    assert failover.restore_checkpoint_id == kept
    assert (in_flight, Reason.JOB_FAILOVER_REGION) in driver.aborted()
    driver.acknowledge_all(in_flight, files=[shared("a")])
    assert in_flight not in driver.completed(), "a late ack completes nothing"
    assert driver.coordinator.store.latest().checkpoint_id == kept
    assert not {shared("a"), shared("b")} & set(driver.discarded_files())
