"""What the job's loop sleeps on between turns (`sparkpoint.agent.wakeup`)."""

from __future__ import annotations

import threading

import pytest

from sparkpoint.agent.sinks import EpochCommitter
from sparkpoint.agent.wakeup import Wakeup, WakingPool


def test_a_wake_up_set_before_the_wait_is_seen_once() -> None:
    wakeup = Wakeup()
    wakeup.set()
    assert wakeup.wait(10)
    assert not wakeup.wait(0.01)  # cleared by the wait that saw it


def test_a_wake_up_set_while_the_turn_runs_ends_the_next_wait() -> None:
    wakeup = Wakeup()
    wakeup.set()
    assert wakeup.wait(10)
    wakeup.set()  # what a future ending during the turn does
    assert wakeup.wait(10)


def test_a_wake_up_from_another_thread_ends_a_wait_before_its_timeout() -> None:
    wakeup = Wakeup()
    waiting = threading.Event()

    def later() -> None:
        waiting.wait(10)
        wakeup.set("a future")  # a done-callback passes its future

    threading.Thread(target=later).start()
    waiting.set()
    assert wakeup.wait(60)


def test_a_future_of_a_waking_pool_wakes_the_loop_once_it_is_done() -> None:
    wakeup = Wakeup()
    pool = WakingPool(wakeup, 1, thread_name_prefix="test")
    gate = threading.Event()
    try:
        future = pool.submit(gate.wait, 10)
        assert not wakeup.wait(0.05)  # running: nothing wakes the loop
        gate.set()
        assert wakeup.wait(10)
        assert future.done() and future.result() is True
    finally:
        gate.set()
        pool.shutdown(wait=True)


def test_a_failed_future_wakes_the_loop_too() -> None:
    wakeup = Wakeup()
    pool = WakingPool(wakeup, 1, thread_name_prefix="test")

    def fail() -> None:
        raise RuntimeError("a stage failed")

    try:
        future = pool.submit(fail)
        assert wakeup.wait(10)
        assert isinstance(future.exception(), RuntimeError)
    finally:
        pool.shutdown(wait=True)


class FailingSink:
    """A sink whose commits fail (what `EpochCommitter` calls of a `SinkWriter`)."""

    writes_ahead = False

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        raise OSError(f"epoch {epoch}: the broker refused the commit")


def test_a_failed_commit_wakes_the_loop_which_then_raises_it() -> None:
    # nothing else would: the loop sleeps while a round runs until something it waits for ends
    wakeup = Wakeup()
    committer = EpochCommitter(FailingSink(), "job")  # type: ignore[arg-type]
    try:
        committer.listen(wakeup.set)
        committer.check()  # nothing failed yet
        committer.submit(3, [], delete=False)
        assert wakeup.wait(10)
        with pytest.raises(RuntimeError, match="committing a sink epoch failed: epoch 3"):
            committer.check()
    finally:
        committer.close()
