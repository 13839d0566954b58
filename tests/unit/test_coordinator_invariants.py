"""A seeded random run of thousands of interleaved events against the coordinator's invariants:

- checkpoint ids strictly increase;
- a non-forced checkpoint is triggered only while fewer than max-concurrent are pending;
- a checkpoint completes only when every subtask acknowledged it;
- nothing completes after it was aborted (expired, declined, subsumed, ...);
- every triggered checkpoint ends exactly once (completed or aborted).
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict

import pytest

from sparkpoint.common.clock import ManualClock
from sparkpoint.common.events import CheckpointFailureReason as Reason
from sparkpoint.common.events import (
    JobStatus,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.commands import FinalizeCheckpoint, Publish
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.core.decider import CheckpointRequest
from sparkpoint.coordinator.core.pending import AckResult
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter
from tests.unit.harness import JOB_ID, T0, Driver, ack, decline, shared, subtasks

STEPS = 3000
SEEDS = range(20)


class CheckedCoordinator(CheckpointCoordinator):
    """Asserts the concurrency limit at the moment of every trigger."""

    def _trigger(self, request: CheckpointRequest, now_ms: int, commands: list) -> None:  # type: ignore[type-arg]
        if not request.is_forced:
            assert len(self.pending) < self.config.max_concurrent, (
                f"non-forced trigger with {len(self.pending)} pending, max {self.config.max_concurrent}"
            )
        super()._trigger(request, now_ms, commands)


def random_config(rng: random.Random) -> CheckpointConfig:
    unaligned = rng.random() < 0.2
    return CheckpointConfig(
        interval_ms=rng.choice([200, 500, 1000, 3000]),
        timeout_ms=rng.choice([1000, 5000, 20_000]),
        min_pause_ms=rng.choice([0, 0, 100, 700]),
        max_concurrent=1 if unaligned else rng.choice([1, 2, 3]),
        tolerable_failed=rng.choice([0, 2, 100]),
        unaligned=unaligned,
        num_retained=rng.choice([1, 2, 3]),
        periodic_savepoint_interval_ms=rng.choice([None, 4000]),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_invariants_hold_under_random_interleavings(seed: int) -> None:
    rng = random.Random(seed)
    parallelism = rng.choice([1, 2, 4, 8])
    core = CheckedCoordinator(
        JobInfo(JOB_ID, subtasks(parallelism)),
        random_config(rng),
        InMemoryCheckpointIdCounter(),
        random.Random(seed),
    )
    driver = Driver(core, ManualClock(T0), auto_finalize=False).start()
    acked: dict[int, set[str]] = defaultdict(set)

    def pending_ids() -> list[int]:
        return sorted(core.pending)

    def send_ack(checkpoint_id: int, subtask: str) -> None:
        message = ack(checkpoint_id, subtask, [shared(f"{checkpoint_id}-{subtask}")], at=driver.now)
        if driver.acknowledge(message) is AckResult.SUCCESS:
            acked[checkpoint_id].add(subtask)

    failovers = 0
    for step in range(STEPS):
        if len(driver.failovers()) > failovers:
            # the agent restarts its job and registers again: what was pending ends, and
            # checkpointing goes on (the service gives the new attempt a fresh coordinator)
            failovers = len(driver.failovers())
            driver.run(core.suspend(driver.now))
            driver.run(core.start(driver.now))
        action = rng.random()
        ids = pending_ids()
        if action < 0.30:
            driver.advance(rng.choice([1, 10, 50, 200, 1000]))
        elif action < 0.62 and ids:
            checkpoint_id = rng.choice(ids)
            waiting = sorted(core.pending[checkpoint_id].not_yet_acknowledged)
            # mostly a subtask that has not acknowledged yet, as agents do; sometimes a duplicate
            send_ack(
                checkpoint_id,
                rng.choice(waiting if waiting and rng.random() < 0.85 else core.job.subtasks),
            )
        elif action < 0.66:
            # unknown ids, unknown subtasks, duplicates and late acknowledgements
            send_ack(
                rng.choice([10_000 + step, *(ids or [1])]),
                rng.choice(["keyed-99", *core.job.subtasks]),
            )
        elif action < 0.70 and ids:
            reason = rng.choice(
                [
                    Reason.CHECKPOINT_DECLINED,
                    Reason.CHECKPOINT_DECLINED_TASK_NOT_READY,
                    Reason.CHECKPOINT_ASYNC_EXCEPTION,
                ]
            )
            driver.decline(decline(rng.choice(ids), rng.choice(core.job.subtasks), reason))
        elif action < 0.82 and driver.to_finalize:
            command: FinalizeCheckpoint = driver.to_finalize.pop(
                rng.randrange(len(driver.to_finalize))
            )
            if command.checkpoint_id not in core.pending:
                continue  # aborted while its metadata was being written (e.g. shut down)
            if rng.random() < 0.9:
                driver.run(core.on_finalized(command.checkpoint_id, driver.now))
            else:
                driver.run(
                    core.on_finalize_failed(command.checkpoint_id, driver.now, "write failed")
                )
        elif action < 0.86:
            driver.run(core.trigger_checkpoint(driver.now, f"m{step}", full=rng.random() < 0.3))
        elif action < 0.88:
            driver.run(core.trigger_savepoint(driver.now, f"s{step}"))
        elif action < 0.95:
            changes = rng.choice([
                {"timeout_ms": rng.choice([100, 400, 2000, 8000])},
                {"interval_ms": rng.choice([100, 400, 2000])},
                {"min_pause_ms": rng.choice([0, 300, 900])},
                {"tolerable_failed": rng.choice([0, 1, 5])},
                {} if core.config.unaligned else {"max_concurrent": rng.choice([1, 2, 4])},
            ])  # fmt: skip
            driver.run(core.apply_config(dataclasses.replace(core.config, **changes), driver.now))
        else:
            driver.run(core.set_backlog(rng.random() < 0.5, driver.now))
    driver.run(core.shutdown(JobStatus.CANCELED, driver.now))

    triggers = driver.events(TriggerCheckpoint)
    ids = [t.checkpoint_id for t in triggers]
    assert ids == sorted(set(ids)), "checkpoint ids must strictly increase"
    assert len(ids) > 50, "the run should exercise many checkpoints"

    ends: dict[int, list[str]] = defaultdict(list)
    for command in driver.commands:
        if isinstance(command, Publish) and isinstance(command.event, NotifyCheckpointComplete):
            checkpoint_id = command.event.checkpoint_id
            assert acked[checkpoint_id] == set(core.job.subtasks), (
                f"{checkpoint_id} completed without every ack"
            )
            assert "aborted" not in ends[checkpoint_id], (
                f"{checkpoint_id} completed after it was aborted"
            )
            ends[checkpoint_id].append("completed")
        elif isinstance(command, Publish) and isinstance(command.event, NotifyCheckpointAborted):
            ends[command.event.checkpoint_id].append("aborted")
    assert {i: e for i, e in ends.items() if len(e) != 1} == {}, "a checkpoint ended more than once"
    assert set(ends) == set(ids), "every triggered checkpoint ends, and only those"
    assert core.pending == {}
    completed = sum(1 for e in ends.values() if e == ["completed"])
    aborted = sum(1 for e in ends.values() if e == ["aborted"])
    assert completed > 0 and aborted > 0
