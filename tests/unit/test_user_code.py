"""A job function raising inside a Spark task (services/sparkpoint/agent/rounds/ (fetch.py, process.py)): the task returns the
failure instead of raising it, so PySpark keeps its Python worker; the driver raises it with
the function's exception name and the trace from the task. sparkpoint's own failures still raise
in the task, where Spark may retry them."""

from __future__ import annotations

import pytest

from sparkpoint.agent.rounds.user_code import (
    UserCodeFailure,
    UserFunctionError,
    guarded,
    unless_user_failed,
    user_code,
)

pytestmark = pytest.mark.unit


def bad_map(frame: list[int]) -> list[int]:
    raise ValueError(f"no amount in {frame}")


def task_calling(function: object, value: list[int]) -> list[int]:
    return user_code(function, value)  # type: ignore[arg-type]


def test_what_the_function_raises_is_the_tasks_result() -> None:
    result = guarded(task_calling, bad_map, [1])
    assert isinstance(result, UserCodeFailure)
    assert result.exception_name == "ValueError" and result.message == "no amount in [1]"
    assert "in bad_map" in result.stacktrace


def test_a_failure_of_sparkpoints_own_work_still_raises_in_the_task() -> None:
    def reading_fails(value: int) -> int:
        raise OSError("broker gone")

    with pytest.raises(OSError, match="broker gone"):
        guarded(reading_fails, 1)


def test_the_driver_raises_the_functions_failure_by_its_name() -> None:
    ok = guarded(task_calling, lambda frame: frame, [2])
    assert unless_user_failed([ok]) == [[2]]
    failed = guarded(task_calling, bad_map, [3])
    with pytest.raises(UserFunctionError, match="ValueError: no amount") as raised:
        unless_user_failed([ok, failed])
    assert raised.value.exception_name == "ValueError"
    assert "in bad_map" in raised.value.stacktrace
