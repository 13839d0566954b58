"""A fresh start's initial state (`KeyedFunction.initial_state`, Spark's ``initialState``): its
rows keyed and split by subtask as stage 1 splits records, one file per subtask, handed to the
first round's stage-2 parts (`ProcessTask.initial_segment`), which call the function's
``on_initial_state`` before any record. Until that round is collected, triggers are declined
``TASK_NOT_READY`` (`not_ready`): no checkpoint can complete without the initial state, so a
restore never needs it again, and a restart before the first checkpoint applies it afresh."""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.agent.job import KeyedFunction, has_initial_state_hook
from sparkpoint.agent.rounds.fetch import by_subtask
from sparkpoint.agent.rounds.frames import to_ipc
from sparkpoint.agent.state.backend import write_file


@dataclass
class InitialState:
    segments: dict[int, str]
    """Subtask -> its rows' file."""
    submitted: bool = False
    """A round carrying it is in flight (or was collected)."""
    applied: bool = False
    """That round was collected: every subtask ran ``on_initial_state``."""

    def not_ready(self) -> tuple[str, str] | None:
        """(subtask, why) while a trigger must be declined, else None."""
        if self.applied:
            return None
        first = min(self.segments)
        return f"keyed-{first}", "has not applied the job's initial state yet"


def initial_state(
    function: KeyedFunction, key: str, max_parallelism: int, parallelism: int, directory: str
) -> InitialState | None:
    """The function's initial state written for its subtasks under ``directory`` (None: it has
    none, or no hook to take it)."""
    if not has_initial_state_hook(function):
        return None
    frame = function.initial_state()
    if frame is None or not len(frame):
        return None
    segments: dict[int, str] = {}
    for subtask, part in by_subtask(
        frame.reset_index(drop=True), key, max_parallelism, parallelism
    ):
        path = f"{directory}/initial/s{subtask:04d}.arrow"
        write_file(path, to_ipc(part))
        segments[subtask] = path
    return InitialState(segments)
