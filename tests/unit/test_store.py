"""Completed checkpoint store: retention, subsumption, reference-counted files, termination."""

from __future__ import annotations

import pytest

from sparkpoint.common.events import JobStatus, SnapshotType
from sparkpoint.common.settings import ExternalizedRetention
from sparkpoint.coordinator.core.store import (
    CompletedCheckpoint,
    CompletedCheckpointStore,
    FileRegistry,
)


def checkpoint(checkpoint_id: int, *files: str) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id,
        SnapshotType.CHECKPOINT,
        True,
        checkpoint_id,
        checkpoint_id + 1,
        f"/cp/chk-{checkpoint_id}",
        10,
        files,
    )


def savepoint(checkpoint_id: int, *files: str) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id,
        SnapshotType.SAVEPOINT,
        False,
        checkpoint_id,
        checkpoint_id + 1,
        f"/sp/{checkpoint_id}",
        10,
        files,
    )


def add(
    store: CompletedCheckpointStore, completed: CompletedCheckpoint
) -> tuple[list[int], list[str]]:
    store.registry.acquire(completed.files)  # the pending checkpoint's hold, handed over
    subsumed, discards = store.add(completed)
    return [c.checkpoint_id for c in subsumed], [f for d in discards for f in d.files]


def ids(store: CompletedCheckpointStore) -> list[int]:
    return [c.checkpoint_id for c in store.checkpoints]


def test_keeps_num_retained_and_subsumes_the_oldest_first() -> None:
    store = CompletedCheckpointStore(num_retained=2)
    for i in (1, 2):
        add(store, checkpoint(i, f"/cp/chk-{i}/own"))
    subsumed, discarded = add(store, checkpoint(3, "/cp/chk-3/own"))
    assert subsumed == [1]
    assert discarded == ["/cp/chk-1/own"]
    assert ids(store) == [2, 3]


def test_the_latest_is_never_subsumed_and_savepoints_count_toward_the_number() -> None:
    store = CompletedCheckpointStore(num_retained=1)
    add(store, checkpoint(1))
    subsumed, _ = add(store, savepoint(2))
    # 1 is the latest checkpoint that is not a savepoint: the job restores from it, so it stays.
    assert subsumed == []
    assert ids(store) == [1, 2]
    subsumed, _ = add(store, checkpoint(3))
    assert subsumed == [1, 2]
    assert ids(store) == [3]


def test_savepoint_files_are_never_discarded() -> None:
    store = CompletedCheckpointStore(num_retained=1)
    add(store, savepoint(1, "/sp/1/state"))
    _, discarded = add(store, checkpoint(2, "/cp/chk-2/own"))
    _, discarded_more = add(store, checkpoint(3, "/cp/chk-3/own"))
    assert "/sp/1/state" not in discarded + discarded_more
    assert store.registry.holders("/sp/1/state") == 1


def test_shared_files_are_discarded_only_when_no_retained_checkpoint_references_them() -> None:
    store = CompletedCheckpointStore(num_retained=2)
    add(store, checkpoint(1, "/shared/a", "/shared/b"))
    add(store, checkpoint(2, "/shared/b", "/shared/c"))
    _, discarded = add(store, checkpoint(3, "/shared/c", "/shared/d"))
    assert discarded == ["/shared/a"]  # b is still held by 2
    _, discarded = add(store, checkpoint(4, "/shared/d"))
    assert discarded == ["/shared/b"]  # c is still held by 3


def test_lowering_num_retained_subsumes_at_once() -> None:
    store = CompletedCheckpointStore(num_retained=3)
    for i in (1, 2, 3):
        add(store, checkpoint(i))
    subsumed, _ = store.set_num_retained(1)
    assert [c.checkpoint_id for c in subsumed] == [1, 2]


@pytest.mark.parametrize(
    ("retention", "status", "discarded"),
    [
        (ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.CANCELED, True),
        (ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.FAILED, True),
        (ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.FINISHED, True),
        (ExternalizedRetention.NO_EXTERNALIZED_CHECKPOINTS, JobStatus.SUSPENDED, True),
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.CANCELED, True),
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.FINISHED, True),
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.FAILED, False),
        (ExternalizedRetention.DELETE_ON_CANCELLATION, JobStatus.SUSPENDED, False),
        (ExternalizedRetention.RETAIN_ON_CANCELLATION, JobStatus.CANCELED, False),
        (ExternalizedRetention.RETAIN_ON_CANCELLATION, JobStatus.FAILED, False),
        (ExternalizedRetention.RETAIN_ON_CANCELLATION, JobStatus.FINISHED, False),
    ],
)
def test_termination_follows_externalized_retention(
    retention: ExternalizedRetention, status: JobStatus, discarded: bool
) -> None:
    store = CompletedCheckpointStore(num_retained=2)
    add(store, checkpoint(1, "/cp/chk-1/own"))
    add(store, savepoint(2, "/sp/2/own"))
    discards = store.shutdown(status, retention)
    assert bool(discards) is discarded
    assert all(d.checkpoint_id == 1 for d in discards)
    assert [c.checkpoint_id for c in store.checkpoints] == ([2] if discarded else [1, 2])


def test_registry_counts_holders() -> None:
    registry = FileRegistry()
    registry.acquire(["a", "b"])
    registry.acquire(["b"])
    assert registry.release(["a", "b"]) == ["a"]
    assert registry.unreferenced(["a", "b", "c"]) == ["a", "c"]
    assert registry.release(["b"]) == ["b"]
    assert len(registry) == 0
