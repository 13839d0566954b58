"""Checkpoint storage on real files: atomic writes, deletes, and the roots it cannot leave."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.common.storage import PathOutsideRoots, Storage
from sparkpoint.coordinator.service.files import (
    LOCAL_THREADS,
    THREADS,
    FileWork,
    Write,
    threads_for,
)


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage([str(tmp_path / "checkpoints"), str(tmp_path / "savepoints")])


def test_atomic_write_leaves_only_the_file(storage: Storage, tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "job" / "chk-1" / "_metadata"
    storage.write_atomic(str(target), b"metadata")
    assert target.read_bytes() == b"metadata"
    assert [p.name for p in target.parent.iterdir()] == ["_metadata"]
    assert storage.read(str(target)) == b"metadata"


def test_a_write_that_fails_leaves_no_temporary_file(storage: Storage, tmp_path: Path) -> None:
    """The rename fails (a directory holds the name): the error reaches the caller, and the
    hidden file written beside the target is gone."""
    target = tmp_path / "checkpoints" / "job" / "chk-2" / "_metadata"
    (target / "taken").mkdir(parents=True)
    with pytest.raises(OSError):
        storage.write_atomic(str(target), b"metadata")
    assert [p.name for p in target.parent.iterdir()] == ["_metadata"]
    assert [p.name for p in target.iterdir()] == ["taken"]


@pytest.mark.parametrize(
    "escape",
    [
        "{root}/../elsewhere/_metadata",
        "/etc/passwd",
        "{root}/job/../../../x",
        "s3://bucket/checkpoints/x",
        "{root}-sibling/x",
    ],
)
def test_paths_outside_the_roots_are_refused(storage: Storage, tmp_path: Path, escape: str) -> None:
    path = escape.format(root=tmp_path / "checkpoints")
    with pytest.raises(PathOutsideRoots):
        storage.write_atomic(path, b"x")
    with pytest.raises(PathOutsideRoots):
        storage.delete([path])


def test_delete_removes_files_and_the_directory(storage: Storage, tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints" / "job" / "chk-2"
    shared = tmp_path / "checkpoints" / "job" / "shared" / "a"
    for path in (directory / "own", shared):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert (
        storage.delete([str(shared), str(tmp_path / "checkpoints" / "missing")], str(directory))
        == 2
    )
    assert not directory.exists() and not shared.exists()


def test_list_dirs_lists_savepoints(storage: Storage, tmp_path: Path) -> None:
    for name in ("savepoint-job-a", "savepoint-job-b"):
        (tmp_path / "savepoints" / name).mkdir(parents=True)
    names = [Path(p).name for p in storage.list_dirs(str(tmp_path / "savepoints"))]
    assert names == ["savepoint-job-a", "savepoint-job-b"]


@pytest.mark.parametrize("where", ["job", "job/chk-1"])
def test_a_symbolic_link_inside_a_root_cannot_lead_out(
    storage: Storage, tmp_path: Path, where: str
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = tmp_path / "checkpoints" / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    with pytest.raises(PathOutsideRoots):
        storage.write_atomic(str(link / "_metadata"), b"x")
    with pytest.raises(PathOutsideRoots):
        storage.delete([str(link / "file")], str(link))
    assert list(outside.iterdir()) == []


def test_a_job_directory_deleted_and_replaced_by_a_link_is_looked_at_again(
    storage: Storage, tmp_path: Path
) -> None:
    """The storage remembers each job's directory as real once seen; a delete through it
    forgets that, so a symbolic link put in its place is refused."""
    job = tmp_path / "checkpoints" / "job"
    storage.write_atomic(str(job / "chk-1" / "_metadata"), b"x")  # the job directory is known
    storage.delete([], str(job))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    job.symlink_to(outside)
    with pytest.raises(PathOutsideRoots):
        storage.write_atomic(str(job / "chk-2" / "_metadata"), b"x")
    assert list(outside.iterdir()) == []


def test_a_root_reached_through_a_symbolic_link_is_the_same_root(tmp_path: Path) -> None:
    real = tmp_path / "real-checkpoints"
    real.mkdir()
    (tmp_path / "checkpoints").symlink_to(real)
    storage = Storage([str(tmp_path / "checkpoints")])
    storage.write_atomic(str(tmp_path / "checkpoints" / "job" / "chk-1" / "_metadata"), b"x")
    storage.write_atomic(str(real / "job" / "chk-2" / "_metadata"), b"y")
    assert (real / "job" / "chk-1" / "_metadata").read_bytes() == b"x"


def test_files_inside_the_deleted_directory_go_with_it(storage: Storage, tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints" / "job" / "chk-3"
    (directory / "sub").mkdir(parents=True)
    inside = [directory / "a", directory / "sub" / "b"]
    for path in inside:
        path.write_bytes(b"x")
    assert storage.delete([str(p) for p in inside], str(directory)) == 1  # the directory
    assert not directory.exists()


def test_file_work_takes_one_thread_on_local_disk_and_four_with_an_object_store(
    tmp_path: Path,
) -> None:
    local = Storage([str(tmp_path / "checkpoints"), f"file://{tmp_path}/savepoints"])
    mixed = Storage([str(tmp_path / "checkpoints"), "s3://bucket/savepoints"])
    assert local.local_only and not mixed.local_only
    assert threads_for(local) == LOCAL_THREADS == 1
    assert threads_for(mixed) == THREADS == 4
    work = FileWork(local, lambda report: report())
    try:
        written: list[Exception | None] = []
        work.write(
            Write(str(tmp_path / "checkpoints/j/chk-1/_metadata"), lambda: b"{}", written.append)
        )
        work.close()
        assert written == [None]
        assert (tmp_path / "checkpoints/j/chk-1/_metadata").read_bytes() == b"{}"
        assert len(work._threads) == 1
    finally:
        work.close()
