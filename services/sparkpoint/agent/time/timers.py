"""The driver's index of event-time timers: per key group, a lower bound of its earliest pending
timer, so a round asks a subtask's task to look for due timers only in the key groups that may
have some (Flink keeps a priority queue of timers per key group; here the timers themselves are
keyed state, in the key groups' runs and bases, and the driver keeps only this bound).

A task reports, for the key groups it read whole, their exact earliest timer, and for the others
the earliest timer its keys registered (which can only lower the bound). After a restore every
key group with state counts as possibly due: the first round whose watermark moves reads each
one once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sparkpoint.agent.time.strategy import MIN_WATERMARK
from sparkpoint.common.keygroups import KeyGroupRange


@dataclass
class TimerIndex:
    earliest: dict[int, int] = field(default_factory=dict)
    """Key group -> a timestamp no later than its earliest pending timer (absent: none)."""

    def restored(self, groups: Iterable[int]) -> None:
        """Key groups restored from a snapshot: their timers are not known yet."""
        self.earliest = dict.fromkeys(groups, MIN_WATERMARK)

    def due(self, groups: KeyGroupRange, watermark: int) -> list[int]:
        """The key groups of ``groups`` that may hold timers at or below ``watermark``."""
        return sorted(
            g
            for g, t in self.earliest.items()
            if groups.start <= g <= groups.end and t <= watermark
        )

    def update(self, exact: Mapping[int, int | None], lowered: Mapping[int, int]) -> None:
        """A round's report: ``exact`` earliest timers of the key groups it read whole (None:
        no timer left), ``lowered`` the earliest its keys registered elsewhere."""
        for group, earliest in exact.items():
            if earliest is None:
                self.earliest.pop(group, None)
            else:
                self.earliest[group] = earliest
        for group, earliest in lowered.items():
            self.earliest[group] = min(self.earliest.get(group, earliest), earliest)
