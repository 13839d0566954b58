"""ManualClock and TimerQueue."""

from __future__ import annotations

import pytest

from sparkpoint.common.clock import ManualClock, TimerQueue


def test_timers_pop_in_due_order() -> None:
    timers = TimerQueue()
    timers.schedule("b", 20)
    timers.schedule("a", 10)
    timers.schedule("c", 30)
    assert [timers.pop_due(25), timers.pop_due(25), timers.pop_due(25)] == [
        (10, "a"),
        (20, "b"),
        None,
    ]
    assert timers.next_due_ms() == 30


def test_scheduling_a_key_again_replaces_it() -> None:
    timers = TimerQueue()
    timers.schedule("canceller", 100)
    timers.schedule("canceller", 300)
    assert timers.pop_due(200) is None
    assert timers.pop_due(300) == (300, "canceller")
    assert len(timers) == 0


def test_a_cancelled_timer_never_fires() -> None:
    timers = TimerQueue()
    timers.schedule("x", 5)
    timers.cancel("x")
    assert timers.pop_due(10) is None
    assert timers.next_due_ms() is None


def test_the_manual_clock_only_moves_forward() -> None:
    clock = ManualClock(100)
    assert clock.advance(50) == 150
    with pytest.raises(ValueError):
        clock.set(10)
