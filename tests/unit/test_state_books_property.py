"""The agent's books of keyed state (`sparkpoint.agent.state.books.StateBackend`, the real class)
against the coordinator's reference counts, over random sequences of rounds, merges,
materializations, snapshots, acknowledgements, declines, completion notices, retention changes,
restores of the latest retained checkpoint and coordinator failovers (seeded), with file merging
on or off (on: copies are segments of merged files, which the coordinator counts).

Checked after every step: no retained checkpoint references a copy the coordinator deleted, no
checkpoint completes on one, the agent deletes no working file that a chain names or a snapshot
in progress still copies from, and a restore finds every key group's state in the files of the
checkpoint it restores (each key group's newest change is in its chain), and a snapshot copies
no file the last completed checkpoint it was told of copied. At the end, with
nothing pending, every copy acknowledged to this owner that no retained checkpoint holds was
deleted."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from sparkpoint.agent.state import books
from sparkpoint.agent.state.backend import physical
from sparkpoint.agent.state.books import StateBackend, Upload, restored_file
from sparkpoint.agent.state.runs import Written
from sparkpoint.common.events import (
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from tests.unit.harness import JOB_DIR, Driver, ack, coordinator, decline
from tests.unit.test_coordinator import config
from tests.unit.test_shared_state_property import settings

pytestmark = pytest.mark.unit

GROUPS = 8
SUBTASKS = ("keyed-0", "keyed-1")
RANGES = (range(0, 4), range(4, 8))
NAMES = itertools.count()


@dataclass
class Agent:
    """The real books, driven as the agent drives them; what each key group last changed in
    (the round's ``seq``), to check restores; copies made, by path."""

    backend: StateBackend
    round: int = 0
    now: float = 0.0
    newest: dict[int, int] = field(default_factory=dict)
    """Key group -> the seq of the newest run or base holding a change to it."""
    uploads: dict[str, Upload] = field(default_factory=dict)
    planned: dict[int, list[list[Upload]]] = field(default_factory=dict)
    """Checkpoint -> per subtask, what its snapshot references."""
    pinned: dict[int, list[str]] = field(default_factory=dict)
    """Checkpoint -> the working files its copies read (pinned until acknowledged)."""
    told: int = 0
    as_of: dict[int, dict[int, int]] = field(default_factory=dict)
    """Checkpoint -> ``newest`` as its snapshot saw it."""
    holds: dict[str, set[int]] = field(default_factory=dict)
    """File (a working file or its copy) -> the key groups it has rows of."""
    sent: dict[int, list[str]] = field(default_factory=dict)
    """Checkpoint -> the copies its acknowledgements named (segments of merged files as the
    agent reads them; the coordinator is told their merged files)."""

    def run_round(self, rng: random.Random) -> None:
        """A round: each subtask's task writes a run of the key groups its records touched, and
        the merge and bases the books asked for."""
        self.round += 1
        self.now += rng.choice([0.2, 0.5, 1.0])
        seq = self.backend.seq(self.round)
        for subtask, groups in enumerate(RANGES):
            asked = self.backend.subtask_state(groups, seq, subtask, self.now)
            touched = tuple(sorted(rng.sample(list(groups), rng.randrange(0, len(groups) + 1))))
            run = None
            if touched:
                run = (self.backend.run_path(seq, subtask), 100, touched)
                self.holds[run[0]] = set(touched)
                for group in touched:
                    self.newest[group] = seq
            merged = None
            if asked.merge:
                live = asked.live()
                held = tuple(sorted({g for p in asked.merge for g in live[p]}))
                merged = (asked.merge_path, 300, held)
                self.holds[asked.merge_path] = set(held)
            bases = dict.fromkeys(asked.materialize, 500)
            for group in asked.materialize:  # a base holds its key group's state as of the round
                self.newest[group] = seq
                self.holds[asked.base_paths[group]] = {group}
            self.backend.install(asked, Written(run, merged, bases), seq, self.now)

    def snapshot(self, checkpoint_id: int) -> None:
        plans, sources = [], []
        for groups in RANGES:
            plan = self.backend.plan(
                checkpoint_id, groups, True, f"{JOB_DIR}/chk-{checkpoint_id}", f"{JOB_DIR}/shared"
            )
            plans.append([upload for upload, _ in plan])
            # incremental: a file a completed checkpoint the agent knows of copied is referenced
            assert not {s for _, s in plan if s is not None} & self.backend.confirmed.keys()
            sources += [source for _, source in plan if source is not None]
            self.uploads.update((u.path, u) for u, _ in plan)
            self.holds.update((u.path, self.holds[s]) for u, s in plan if s is not None)
        self.planned[checkpoint_id] = plans
        self.as_of[checkpoint_id] = dict(self.newest)
        self.pinned[checkpoint_id] = sources

    def copied(self, checkpoint_id: int) -> None:
        """The snapshot's copies are made: its sources are released."""
        self.backend.release(self.pinned.pop(checkpoint_id, []))

    def read_notices(self, driver: Driver, until: int | None = None) -> None:
        read = 0
        for event in driver.events(
            NotifyCheckpointComplete | NotifyCheckpointAborted | TriggerCheckpoint
        ):
            if isinstance(event, TriggerCheckpoint):
                if event.checkpoint_id == until:
                    break
                continue
            read += 1
            if read <= self.told:
                continue
            if isinstance(event, NotifyCheckpointComplete):
                self.backend.complete(event.checkpoint_id, False)
            else:
                self.backend.abort(event.checkpoint_id)
            self.told = read

    def restore(self, checkpoint_id: int | None, files: tuple[str, ...]) -> None:
        """A new attempt restores checkpoint ``checkpoint_id`` (None: none is retained, the job
        starts empty) from its ``files``: the books start again from them."""
        self.planned.clear()
        for sources in self.pinned.values():
            self.backend.release(sources)
        self.pinned.clear()
        restored = [
            restored_file(p, self.uploads[p].size, self.uploads[p].first, self.uploads[p].last)
            for p in files
        ]
        self.backend.restore(restored, shared=True, now=self.now)
        restored_newest = newest_changes(self.backend, self.holds)
        expected = self.as_of[checkpoint_id] if checkpoint_id is not None else {}
        assert restored_newest == expected, "the restored chains are the snapshot's state"
        self.newest = restored_newest


def newest_changes(backend: StateBackend, holds: dict[str, set[int]]) -> dict[int, int]:
    """Key group -> the seq of the newest file its chain names that has rows of it (a run
    names the range of key groups ``first..last``, which may include some it has no rows of)."""
    found = {}
    for group, chain in backend.chains.items():
        seqs = [f.seq for f in chain.durable() if group in holds[f.path]]
        if seqs:
            found[group] = max(seqs)
    return found


def check(driver: Driver, agent: Agent, deleted_working: list[str]) -> None:
    deleted = set(driver.discarded_files())
    for retained in driver.coordinator.store.checkpoints:
        assert not deleted & set(retained.files), (retained.checkpoint_id, deleted)
    named = {f.path for c in agent.backend.chains.values() for f in [*c.files(), *c.log]}
    copying = {p for sources in agent.pinned.values() for p in sources}
    assert not set(deleted_working) & (named | copying)
    assert newest_changes(agent.backend, agent.holds) == agent.newest  # no change is lost


def run(seed: int, monkeypatch: pytest.MonkeyPatch, steps: int = 150) -> None:
    rng = random.Random(seed)
    deleted_working: list[str] = []
    monkeypatch.setattr(books, "delete_files", deleted_working.extend)
    driver = coordinator(
        config(max_concurrent=rng.choice([1, 2, 3]), num_retained=rng.choice([1, 2]),
               timeout_ms=600_000, tolerable_failed=1_000_000),
        parallelism=2, seed=seed,
    )  # fmt: skip
    merging = rng.choice([None, 250])  # file merging: runs of 100 and 300 bytes, bases of 500
    agent = Agent(
        StateBackend(
            "/work/state", materialize_interval_s=rng.choice([3.0, 60.0]),
            merged_file_bytes=merging,
        )
    )  # fmt: skip
    acknowledged: set[str] = set()
    for _ in range(steps):
        pending = sorted(driver.coordinator.pending)
        waiting = [c for c in pending if c not in agent.planned]
        ready = [c for c in pending if c in agent.planned]
        step = rng.choice(["round", "round", "round", "tick", "snapshot", "snapshot", "ack",
                           "ack", "decline", "retain", "notices", "notices", "garbage",
                           "restore", "failover"])  # fmt: skip
        if step == "round":
            agent.run_round(rng)
        elif step == "tick":
            driver.advance(rng.choice([200, 1000, 1500]))
        elif step == "snapshot" and waiting:
            chosen = rng.choice(waiting)
            agent.read_notices(driver, until=chosen)
            agent.snapshot(chosen)
        elif step == "ack" and ready:
            chosen = rng.choice(ready)
            agent.copied(chosen)
            deleted = set(driver.discarded_files())
            for subtask, uploads in zip(SUBTASKS, agent.planned.pop(chosen), strict=True):
                agent.sent.setdefault(chosen, []).extend(u.path for u in uploads)
                files = [physical(u.path) for u in uploads]
                driver.acknowledge(ack(chosen, subtask, files, at=driver.now))
                acknowledged.update(files)
                if chosen in driver.completed():
                    assert not deleted & set(files), f"{chosen} completed on deleted files"
        elif step == "decline" and pending:
            driver.decline(decline(rng.choice(pending), rng.choice(SUBTASKS)))
        elif step == "retain":
            driver.configure(num_retained=rng.choice([1, 2, 3]))
        elif step == "notices":
            agent.read_notices(driver)
        elif step == "garbage":
            agent.backend.collect_garbage()
        elif step in ("restore", "failover") and rng.random() < 0.25:
            if step == "failover":  # a new owner from the store record; the old pending is lost
                retained = list(driver.coordinator.store.checkpoints)
                successor = coordinator(
                    config(**settings(driver)), parallelism=2, seed=rng.randrange(1000)
                )
                successor.coordinator.restore(retained)
                successor.commands[:0] = driver.commands  # what was deleted stays deleted
                driver, acknowledged = successor, set()
            else:  # a restart of the job: the new attempt's registration aborts what is pending
                for chosen in sorted(driver.coordinator.pending):
                    driver.decline(decline(chosen, SUBTASKS[0]))
            agent.told = len(driver.events(NotifyCheckpointComplete | NotifyCheckpointAborted))
            latest = driver.coordinator.store.latest_checkpoint()
            if latest is None:
                agent.restore(None, ())
            else:
                assert {physical(p) for p in agent.sent[latest.checkpoint_id]} == set(latest.files)
                agent.restore(latest.checkpoint_id, tuple(agent.sent[latest.checkpoint_id]))
        check(driver, agent, deleted_working)
    for chosen in sorted(driver.coordinator.pending):
        driver.decline(decline(chosen, SUBTASKS[0]))
    check(driver, agent, deleted_working)
    held = {f for c in driver.coordinator.store.checkpoints for f in c.files}
    leaked = acknowledged - held - set(driver.discarded_files())
    assert not leaked, leaked


@pytest.mark.parametrize("seed", range(300))
def test_the_books_and_the_coordinators_counts_never_lose_a_file_a_checkpoint_needs(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(seed, monkeypatch)
