"""The job's own code inside Spark tasks: what it raises is returned as the task's result, not
raised (`UserCodeFailure`), and raised again on the driver as `UserFunctionError`."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class UserCodeFailure:
    """What a task returns when the job's own function (map, keyed function) raised. It is
    returned, not raised: an exception out of a task ends PySpark's Python worker, and the
    restarted job's first rounds would pay for new workers (imports, cold state caches). A
    failure of sparkpoint's own work (reading Kafka, writing files) is raised, so that Spark
    retries the task where the cluster allows it."""

    exception_name: str
    message: str
    stacktrace: str


class UserCodeRaised(Exception):
    def __init__(self, failure: UserCodeFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class UserFunctionError(RuntimeError):
    """Raised on the driver for a `UserCodeFailure`: carries the function's exception name and
    the stack trace from the task, which the job's exception history shows."""

    def __init__(self, failure: UserCodeFailure) -> None:
        super().__init__(f"{failure.exception_name}: {failure.message}")
        self.exception_name = failure.exception_name
        self.stacktrace = failure.stacktrace


T = TypeVar("T")


def user_code(call: Callable[..., T], *args: Any) -> T:
    """Calls the job's function, turning what it raises into `UserCodeRaised`."""
    try:
        return call(*args)
    except Exception as exc:
        raise UserCodeRaised(
            UserCodeFailure(type(exc).__qualname__, str(exc), "".join(traceback.format_exc()))
        ) from exc


def guarded(run: Callable[..., T], *args: Any) -> T | UserCodeFailure:
    """Runs a task body; the job's function raising is its result (see `UserCodeFailure`)."""
    try:
        return run(*args)
    except UserCodeRaised as raised:
        return raised.failure


def unless_user_failed(results: list[T | UserCodeFailure]) -> list[T]:
    """The tasks' results; `UserFunctionError` if the job's function raised in one."""
    done: list[T] = []
    for result in results:
        if isinstance(result, UserCodeFailure):
            raise UserFunctionError(result)
        done.append(result)
    return done
