"""The coordinator never deletes a shared file a checkpoint may still need, whatever the order of
triggers, snapshots, acknowledgements, declines, retention changes and coordinator failovers
(random sequences, seeded).

The agent is modelled as `sparkpoint.agent.state.backend.StateBackend` behaves: key groups
change; a snapshot, taken some time after its trigger, references the shared copy of the newest
checkpoint it was told completed for every key group unchanged since, and makes new copies of
the others; a completion notice makes that checkpoint's copies the base of later snapshots.
Checked after every step: no retained checkpoint references a deleted file, and no checkpoint
completes referencing one. At the end, with nothing pending: every file no retained checkpoint
holds was deleted (nothing leaks). With one checkpoint in flight at a time the old coordinator
passed; with several it deleted the base of a pending snapshot (the class of Spark's
SPARK-55892), which `DiscardGate` prevents."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from sparkpoint.common.events import NotifyCheckpointComplete, TriggerCheckpoint
from tests.unit.harness import Driver, ack, coordinator, decline, shared
from tests.unit.test_coordinator import config

pytestmark = pytest.mark.unit

GROUPS = 4
NAMES = itertools.count()
SUBTASKS = ("keyed-0", "keyed-1")


@dataclass
class Agent:
    """The agent's view: each key group's version, the confirmed copies, each snapshot's plan."""

    versions: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(GROUPS), 0))
    confirmed: dict[int, tuple[int, str]] = field(default_factory=dict)
    planned: dict[int, dict[int, tuple[int, str]]] = field(default_factory=dict)
    told: int = 0
    """How many completion notices the agent has read."""

    def snapshot(self, checkpoint_id: int) -> None:
        plan = {}
        for group, version in self.versions.items():
            base = self.confirmed.get(group)
            if base is not None and base[0] == version:
                plan[group] = base
            else:
                # unique, as the agent's are (a uuid): ids repeat across owners' aborted attempts
                name = f"kg-{group}-c{checkpoint_id}-{next(NAMES)}"
                plan[group] = (version, shared(name))
        self.planned[checkpoint_id] = plan

    def read_notices(self, driver: Driver, until: int | None = None) -> None:
        """Completion notices, in the order the control topic carries them; ``until``: only
        those published before that checkpoint's trigger (the agent reads a trigger after every
        notice before it, so a snapshot is planned against at least those)."""
        read = 0
        for event in driver.events(NotifyCheckpointComplete | TriggerCheckpoint):
            if isinstance(event, TriggerCheckpoint):
                if event.checkpoint_id == until:
                    break
                continue
            read += 1
            if read <= self.told:
                continue
            plan = self.planned.get(event.checkpoint_id)
            if plan is not None:
                self.confirmed = dict(plan)
            self.told = read


def files_of(plan: dict[int, tuple[int, str]]) -> list[str]:
    return [path for _, path in plan.values()]


def check(driver: Driver) -> None:
    deleted = set(driver.discarded_files())
    for retained in driver.coordinator.store.checkpoints:
        assert not deleted & set(retained.files), (retained.checkpoint_id, deleted)


def failover(driver: Driver, agent: Agent, rng: random.Random) -> Driver:
    """A new owner: the retained checkpoints as the store record holds them; what was pending
    is left behind (the old owner's); the agent restores from the latest retained checkpoint,
    whose shared copies become its base."""
    retained = list(driver.coordinator.store.checkpoints)
    successor = coordinator(config(**settings(driver)), parallelism=2, seed=rng.randrange(1000))
    successor.coordinator.restore(retained)
    successor.commands[:0] = driver.commands  # what was deleted stays deleted
    agent.planned.clear()
    agent.told = len(successor.events(NotifyCheckpointComplete))
    agent.confirmed = {}
    if retained:
        for path in retained[-1].files:
            group = int(path.rsplit("/", 1)[1].split("-")[1])
            agent.confirmed[group] = (agent.versions[group], path)
    return successor


def settings(driver: Driver) -> dict[str, object]:
    current = driver.coordinator.config
    return {
        "max_concurrent": current.max_concurrent,
        "num_retained": current.num_retained,
        "timeout_ms": current.timeout_ms,
        "tolerable_failed": current.tolerable_failed,
    }


def run(seed: int, steps: int = 120) -> None:
    rng = random.Random(seed)
    driver = coordinator(
        config(max_concurrent=rng.choice([1, 2, 3]), num_retained=rng.choice([1, 2]),
               timeout_ms=600_000, tolerable_failed=1_000_000),
        parallelism=2, seed=seed,
    )  # fmt: skip
    agent = Agent()
    snapshotted: set[int] = set()
    acknowledged: dict[int, set[str]] = {id(driver): set()}
    for _ in range(steps):
        pending = sorted(driver.coordinator.pending)
        waiting = [c for c in pending if c not in snapshotted]
        ready = [c for c in pending if c in snapshotted]
        step = rng.choice(["change", "change", "tick", "tick", "snapshot", "snapshot", "ack",
                           "ack", "decline", "retain", "notices", "notices", "failover"])  # fmt: skip
        if step == "change":
            agent.versions[rng.randrange(GROUPS)] += 1
        elif step == "tick":
            driver.advance(rng.choice([200, 1000, 1500]))
        elif step == "snapshot" and waiting:
            chosen = rng.choice(waiting)
            agent.read_notices(driver, until=chosen)
            agent.snapshot(chosen)
            snapshotted.add(chosen)
        elif step == "ack" and ready:
            chosen = rng.choice(ready)
            files = files_of(agent.planned[chosen])
            deleted = set(driver.discarded_files())
            for index, subtask in enumerate(SUBTASKS):
                driver.acknowledge(ack(chosen, subtask, files[index::2], at=driver.now))
            acknowledged[id(driver)].update(files)
            if chosen in driver.completed():
                assert not deleted & set(files), f"checkpoint {chosen} completed on deleted files"
        elif step == "decline" and pending:
            driver.decline(decline(rng.choice(pending), rng.choice(SUBTASKS)))
        elif step == "retain":
            driver.configure(num_retained=rng.choice([1, 2, 3]))
        elif step == "notices":
            agent.read_notices(driver)
        elif step == "failover" and rng.random() < 0.2:
            driver = failover(driver, agent, rng)
            acknowledged[id(driver)] = set()
            snapshotted.clear()
        check(driver)
    # the end: nothing pending, and every file acknowledged to this owner that no retained
    # checkpoint holds is gone (an earlier owner's pending files are its successor's leak)
    for chosen in sorted(driver.coordinator.pending):
        driver.decline(decline(chosen, SUBTASKS[0]))
    check(driver)
    held = {f for c in driver.coordinator.store.checkpoints for f in c.files}
    leaked = acknowledged[id(driver)] - held - set(driver.discarded_files())
    assert not leaked, leaked


@pytest.mark.parametrize("seed", range(1000))
def test_no_shared_file_is_deleted_while_a_checkpoint_may_need_it(seed: int) -> None:
    run(seed)


def test_the_base_of_a_pending_snapshot_survives_its_subsumption() -> None:
    """The sequence the random runs found first: c2 and c3 in flight; c2 completes and the agent
    plans c4 against it; c3 completes and subsumes c2, whose copy c4 references."""
    driver = coordinator(config(max_concurrent=3, num_retained=1, timeout_ms=60_000))
    c1 = next_trigger(driver)
    driver.acknowledge_all(c1, files=[shared("g-v0")])
    c2, c3 = next_trigger(driver), next_trigger(driver)
    driver.acknowledge_all(c2, files=[shared("g-v1")])  # the agent's base is now c2
    c4 = next_trigger(driver)  # planned against c2: references g-v1
    driver.acknowledge_all(c3, files=[shared("g-v1b")])  # subsumes c2
    assert shared("g-v1") not in driver.discarded_files()
    driver.acknowledge_all(c4, files=[shared("g-v1")])
    assert c4 in driver.completed() and shared("g-v1") not in driver.discarded_files()
    assert shared("g-v1b") in driver.discarded_files()  # subsumed by c4, and nothing took it


def next_trigger(driver: Driver) -> int:
    from tests.unit.test_coordinator import triggered

    return triggered(driver)
