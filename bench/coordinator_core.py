"""Coordinator core throughput: decisions per second for 1,000 jobs x 8 subtasks at a 1 s
checkpoint interval, processed by the pure core on one core (no Kafka, no I/O). Writes
bench/results/coordinator_core.json.

Virtual time runs for SECONDS; every trigger is answered by 8 acknowledgements 20 ms later and
every fully acknowledged checkpoint is finalized at once, as the service would after writing
``_metadata``. Only the time spent inside the core's methods is counted: building the
acknowledgement events is the agents' work and is left out. Target: at least 200,000
acknowledgements per second.
"""

from __future__ import annotations

import heapq
import random
import time

from recording import write_results

from sparkpoint.common.clock import TimerQueue
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    StateHandle,
    StateHandleKind,
    TriggerCheckpoint,
)
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.commands import (
    CancelTimer,
    FinalizeCheckpoint,
    Publish,
    ScheduleTimer,
    Timer,
)
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter

JOBS = 1000
SUBTASKS = 8
INTERVAL_MS = 1000
SECONDS = 30
ACK_DELAY_MS = 20
TARGET_ACKS_PER_S = 200_000


def main() -> None:
    config = CheckpointConfig(
        interval_ms=INTERVAL_MS, timeout_ms=10_000, num_retained=1, checkpoint_dir="/cp"
    )
    subtasks = tuple(f"keyed-{i}" for i in range(SUBTASKS))
    coordinators = {}
    timers = TimerQueue()
    now = 0
    for j in range(JOBS):
        job_id = f"job-{j:04d}"
        core = CheckpointCoordinator(
            JobInfo(job_id, subtasks), config, InMemoryCheckpointIdCounter(), random.Random(j)
        )
        coordinators[job_id] = core
        for command in core.start(now):
            if isinstance(command, ScheduleTimer):
                timers.schedule(command.timer, command.due_ms)

    acks: list[tuple[int, int, AcknowledgeCheckpoint]] = []  # (due, sequence, ack)
    sequence = 0
    counted = {"timer": 0, "ack": 0, "finalize": 0}
    spent = {"timer": 0, "ack": 0, "finalize": 0}
    completed = 0
    clock = time.perf_counter_ns
    end = SECONDS * 1000

    def handle(commands: object, core: CheckpointCoordinator) -> None:
        nonlocal sequence, completed
        for command in commands:  # type: ignore[attr-defined]
            if isinstance(command, ScheduleTimer):
                timers.schedule(command.timer, command.due_ms)
            elif isinstance(command, CancelTimer):
                timers.cancel(command.timer)
            elif isinstance(command, Publish) and isinstance(command.event, TriggerCheckpoint):
                trigger = command.event
                for subtask in subtasks:
                    handle_path = f"/cp/{trigger.job_id}/shared/{subtask}-{trigger.checkpoint_id}"
                    ack = AcknowledgeCheckpoint(
                        trigger.job_id, trigger.checkpoint_id, subtask, 0, now + ACK_DELAY_MS,
                        [StateHandle(handle_path, StateHandleKind.KEYED_STATE, 4096, shared=True)],
                        4096, 1, 1, 10, 0, False, 4096, 0,
                    )  # fmt: skip
                    sequence += 1
                    heapq.heappush(acks, (now + ACK_DELAY_MS, sequence, ack))
            elif isinstance(command, FinalizeCheckpoint):
                started = clock()
                more = core.on_finalized(command.checkpoint_id, now)
                spent["finalize"] += clock() - started
                counted["finalize"] += 1
                completed += 1
                handle(more, core)

    wall_started = time.perf_counter()
    while now <= end:
        next_timer = timers.next_due_ms()
        next_ack = acks[0][0] if acks else None
        candidates = [t for t in (next_timer, next_ack) if t is not None]
        if not candidates:
            break
        now = min(candidates)
        if now > end:
            break
        if next_ack is not None and next_ack <= now:
            _, _, ack = heapq.heappop(acks)
            core = coordinators[ack.job_id]
            started = clock()
            _, commands, _ = core.on_acknowledge(ack, now)
            spent["ack"] += clock() - started
            counted["ack"] += 1
            handle(commands, core)
            continue
        popped = timers.pop_due(now)
        assert popped is not None
        timer: Timer = popped[1]  # type: ignore[assignment]
        core = coordinators[timer.job_id]
        started = clock()
        commands = core.on_timer(timer, now)
        spent["timer"] += clock() - started
        counted["timer"] += 1
        handle(commands, core)
    wall = time.perf_counter() - wall_started

    core_seconds = sum(spent.values()) / 1e9
    acks_per_s = counted["ack"] / (spent["ack"] / 1e9)
    decisions = sum(counted.values())
    results = {
        "benchmark": "coordinator_core",
        "setup": f"{JOBS} jobs x {SUBTASKS} subtasks, interval {INTERVAL_MS} ms, {SECONDS} s of virtual time, one core",
        "acknowledgements": counted["ack"],
        "timer_firings": counted["timer"],
        "completed_checkpoints": completed,
        "acks_per_s": round(acks_per_s),
        "decisions_per_s": round(decisions / core_seconds),
        "mean_us": {kind: round(spent[kind] / max(1, counted[kind]) / 1000, 2) for kind in spent},
        "core_seconds": round(core_seconds, 3),
        "wall_seconds_including_simulation": round(wall, 3),
        "target_acks_per_s": TARGET_ACKS_PER_S,
        "meets_target": acks_per_s >= TARGET_ACKS_PER_S,
    }
    path = write_results("coordinator_core", results)
    print(f"coordinator core: {results['setup']}")
    print(
        f"  {counted['ack']:,} acknowledgements, {counted['timer']:,} timer firings, {completed:,} checkpoints completed"
    )
    print(f"  acknowledgements: {acks_per_s:,.0f} /s (target {TARGET_ACKS_PER_S:,})")
    print(f"  all decisions:    {results['decisions_per_s']:,} /s")
    print("  mean per call:    " + ", ".join(f"{k} {v} us" for k, v in results["mean_us"].items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
