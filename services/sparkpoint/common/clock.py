"""Time for pure logic: a clock to read and a queue of timers to fire, both injectable.

The coordinator core never reads the wall clock and never sleeps: it is handed ``now_ms`` with
every input and asks for timers through commands. The service fires those timers from a
`TimerQueue` driven by the real clock; unit tests and benchmarks drive the same queue with a
`ManualClock`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Hashable
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock epoch milliseconds (what events carry)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError(f"time does not go backwards ({ms} ms)")
        self._now += ms
        return self._now

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError(f"time does not go backwards ({self._now} -> {now_ms})")
        self._now = now_ms


class TimerQueue:
    """Timers keyed by any hashable key; scheduling a key again replaces its earlier due time.

    Cancelled and replaced entries stay in the heap and are skipped when they surface
    (lazy deletion), so schedule and cancel are O(log n) and O(1)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable]] = []
        self._due: dict[Hashable, tuple[int, int]] = {}
        self._sequence = itertools.count()

    def schedule(self, key: Hashable, due_ms: int) -> None:
        entry = (due_ms, next(self._sequence))
        self._due[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def due_ms(self, key: Hashable) -> int | None:
        entry = self._due.get(key)
        return None if entry is None else entry[0]

    def next_due_ms(self) -> int | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> tuple[int, Hashable] | None:
        """The earliest timer due at or before ``now_ms``, removed; None if there is none."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        due, _, key = heapq.heappop(self._heap)
        del self._due[key]
        return due, key

    def __len__(self) -> int:
        return len(self._due)

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)
