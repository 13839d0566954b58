"""Snapshot copies finish on other threads: one that finishes while the loop sorts them is
answered later, never dropped (a dropped copy left its checkpoint waiting for an ack forever)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from sparkpoint.agent.checkpointing.pending import Copied, Copy, split_done


class FinishesWhileLookedAt(Future[Any]):
    """Not done the first time it is asked, done from then on."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def done(self) -> bool:
        self.asked += 1
        return self.asked > 1


def test_a_copy_finishing_meanwhile_stays_to_be_answered() -> None:
    finished: Future[Any] = Future()
    finished.set_result(Copied([]))
    racing = Copy(1, FinishesWhileLookedAt(), 0, 0.0)
    done, running = split_done([Copy(0, finished, 0, 0.0), racing])
    assert [c.subtask for c in done] == [0]
    assert running == [racing], "kept, to be answered on the next call"
    done, running = split_done(running)
    assert done == [racing] and running == []
