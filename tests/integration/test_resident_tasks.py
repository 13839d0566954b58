"""Resident tasks on the shared Spark session (services/sparkpoint/agent/spark/resident.py and
jobs.py): long-running Spark tasks, one per slot, that run the agent's tasks as they come. Each
test lets its workers go at its end, so the session's slots are free for the next test."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sparkpoint.agent.spark.jobs import ROUNDS_POOL, SINK_POOL, SNAPSHOT_POOL, SparkJobs
from sparkpoint.agent.spark.resident import (
    ResidentTaskError,
    ResidentWorkers,
    receive,
    send,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def jobs(spark: Any) -> Iterator[SparkJobs]:
    jobs = SparkJobs("resident tests", "local[2]", {}, spark, resident=True)
    try:
        yield jobs
    finally:
        jobs.close()
        # the slots are free again: a job of the shared session runs at once
        assert spark.sparkContext.parallelize(range(2), 2).map(square).collect() == [0, 1]


def square(x: int) -> int:
    return x * x


def where(x: int) -> tuple[int, int]:
    return x, os.getpid()


def meeting(task: tuple[str, int]) -> int:
    """Waits until both tasks of the call run at once (each leaves its pid in ``folder``): one
    worker cannot run both, whichever worker's thread the machine's load lets go first."""
    folder, _ = task
    with open(os.path.join(folder, str(os.getpid())), "w"):
        pass
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def fail(x: int) -> int:
    raise ValueError(f"task {x} refuses")


def die(_: int) -> int:
    os._exit(3)


def stamped(seconds: float) -> float:
    time.sleep(seconds)
    return time.monotonic()


def test_frames_cross_a_socket_whole_and_a_close_between_frames_ends_them() -> None:
    ours, theirs = socket.socketpair()
    big = os.urandom(3 << 20)
    sender = threading.Thread(target=lambda: [send(ours, big), send(ours, b""), ours.close()])
    sender.start()
    assert receive(theirs) == big
    assert receive(theirs) == b""
    assert receive(theirs) is None
    sender.join()
    ours, theirs = socket.socketpair()
    ours.sendall(b"\x00\x00\x00\x00\x00\x00\x00\x09abc")  # 9 bytes announced, 3 sent
    ours.close()
    with pytest.raises(EOFError):
        receive(theirs)


def test_tasks_run_in_the_resident_workers_with_their_results_in_order(
    jobs: SparkJobs, tmp_path: Any
) -> None:
    jobs.warm_up(2)
    assert jobs.resident

    assert jobs.run(ROUNDS_POOL, "squares", list(range(7)), square) == [x * x for x in range(7)]
    found = jobs.run(ROUNDS_POOL, "where", list(range(20)), where)
    assert [x for x, _ in found] == list(range(20))

    # a free worker takes the next task, so 20 short ones may all go to one worker on a busy
    # machine; two that wait for each other show both workers
    pids = set(jobs.run(ROUNDS_POOL, "meeting", [(str(tmp_path), 0), (str(tmp_path), 1)], meeting))
    assert len(pids) == 2 and os.getpid() not in pids, "two resident workers, not the driver"
    assert {pid for _, pid in found} <= pids
    assert jobs.run(ROUNDS_POOL, "where", [0, 1], where)[0][1] in pids, "the same workers"
    assert jobs.traffic.stages >= 3 and jobs.traffic.from_tasks > 0


def test_a_failing_task_fails_its_call_with_its_traceback_and_the_workers_go_on(
    jobs: SparkJobs,
) -> None:
    jobs.warm_up(2)
    workers = jobs._resident
    assert workers is not None
    pids = {worker.pid for worker in workers._workers}

    with pytest.raises(ResidentTaskError, match=r"(?s)Traceback.*ValueError: task 1 refuses"):
        jobs.run(ROUNDS_POOL, "failing", [1], fail)

    assert jobs.run(ROUNDS_POOL, "squares", [3, 4], square) == [9, 16]
    assert {pid for _, pid in jobs.run(ROUNDS_POOL, "where", list(range(8)), where)} <= pids
    assert jobs._resident is workers and workers.broken is None, "the same workers serve on"


def test_a_worker_that_dies_fails_the_call_and_the_next_call_has_new_workers(
    jobs: SparkJobs,
) -> None:
    jobs.warm_up(2)

    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"resident tasks unavailable: .*is gone"):
        jobs.run(ROUNDS_POOL, "dying", [0], die)
    assert time.monotonic() - started < 30, "noticed when its socket closed"

    assert jobs.run(ROUNDS_POOL, "squares", [5, 6], square) == [25, 36]


def test_cancel_ends_a_running_task_at_once_and_later_calls_start_new_workers(
    jobs: SparkJobs,
) -> None:
    jobs.warm_up(2)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            jobs.run(ROUNDS_POOL, "a failed attempt's round", [600.0], stamped)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    jobs.cancel_open()
    thread.join(30)

    assert not thread.is_alive() and time.monotonic() - started < 5
    assert outcome and "cancelled" in str(outcome[0])
    assert jobs.run(ROUNDS_POOL, "squares", [7], square) == [49]


def test_a_free_worker_takes_a_completed_epochs_task_before_a_round_queued_earlier(
    jobs: SparkJobs,
) -> None:
    """Both workers busy (a savepoint's folds); a round queued, then a sink task: the first free
    worker takes the sink's (spark_pools.xml's order under FAIR)."""
    jobs.warm_up(2)
    ended: dict[str, float] = {}

    def call(name: str, pool: str, seconds: float) -> None:
        ended[name] = jobs.run(pool, name, [seconds], stamped)[0]

    folds = [threading.Thread(target=call, args=(f"fold {i}", SNAPSHOT_POOL, 1.5)) for i in (1, 2)]
    for thread in folds:
        thread.start()
    time.sleep(0.5)
    late = [
        threading.Thread(target=call, args=("round", ROUNDS_POOL, 0.3)),
        threading.Thread(target=call, args=("epoch", SINK_POOL, 0.3)),
    ]
    for thread in late:
        thread.start()
        time.sleep(0.2)
    for thread in folds + late:
        thread.join(30)

    assert ended["epoch"] < ended["round"], ended


def test_a_connection_without_the_token_is_refused(spark: Any) -> None:
    workers = ResidentWorkers(spark.sparkContext, 2)
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(workers.address)
    send(stranger, pickle.dumps((b"guessed", 0, os.getpid())))
    try:
        workers.start()
        assert workers.run(ROUNDS_POOL, [2, 3], square) == [4, 9]
        stranger.settimeout(10)
        assert receive(stranger) is None, "closed, never served"
    finally:
        stranger.close()
        workers.close()
    assert not os.path.exists(workers.address), "the socket's name goes once all connected"
