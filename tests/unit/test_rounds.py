"""A round is one Spark job running both stages, or on resident tasks one call per stage
(agent/rounds/rounds.py): how its parts become tasks, how a finished call's results reach the
two stages' futures, and how stage 1's call follows stage 2's. Pure logic: no Spark."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from sparkpoint.agent.rounds.calls import (
    ChainedStage,
    FetchOutcome,
    ProcessOutcome,
    hand_out,
    round_tasks,
)
from sparkpoint.agent.rounds.fetch import FetchResult, FetchTask
from sparkpoint.agent.rounds.process import ProcessResult, ProcessTask
from sparkpoint.agent.rounds.user_code import UserCodeFailure, UserFunctionError


def process_task(subtask: int) -> ProcessTask:
    return ProcessTask(subtask, "/c", [f"s{subtask}.arrow"], {}, "/s", 1, f"/o{subtask}")


def fetch_tasks(partition: int) -> list[FetchTask]:
    return [FetchTask("b", "t", partition, 0, None, 10, "k", 128, 2)]


def fetched(partition: int) -> list[FetchResult]:
    return [FetchResult("t", partition, 5, 5, [], [])]


def test_parts_that_fit_the_cores_run_as_tasks_of_their_own() -> None:
    tasks = round_tasks([process_task(0)], [fetch_tasks(0)], cores=2)
    assert [(t.process is not None, len(t.fetch)) for t in tasks] == [(True, 0), (False, 1)]


def test_more_parts_than_cores_pair_a_stage_2_part_with_a_stage_1_part() -> None:
    tasks = round_tasks(
        [process_task(0), process_task(1), process_task(2)], [fetch_tasks(0), fetch_tasks(1)], 2
    )
    assert [t.process.subtask if t.process else None for t in tasks] == [0, 1, 2]
    assert [t.fetch[0].partition if t.fetch else None for t in tasks] == [0, 1, None]
    only_fetch = round_tasks([], [fetch_tasks(0), fetch_tasks(1), fetch_tasks(2)], 2)
    assert [(t.process, len(t.fetch)) for t in only_fetch] == [(None, 1)] * 3


def finished(
    results: list[tuple[ProcessOutcome, FetchOutcome]],
) -> Future[list[tuple[ProcessOutcome, FetchOutcome]]]:
    whole: Future[list[tuple[ProcessOutcome, FetchOutcome]]] = Future()
    whole.set_result(results)
    return whole


def test_a_finished_round_hands_each_stage_its_results_in_order() -> None:
    processing: Future[list[ProcessResult]] = Future()
    fetching: Future[list[FetchResult]] = Future()
    first, second = ProcessResult(0, {1: 10}, None), ProcessResult(1, {}, "/o1")
    hand_out(
        finished([(first, fetched(0)), (second, None), (None, fetched(3))]), processing, fetching
    )
    assert processing.result() == [first, second]
    assert [r.partition for r in fetching.result()] == [0, 3]


def test_the_jobs_own_function_raising_fails_only_its_stage() -> None:
    processing: Future[list[ProcessResult]] = Future()
    fetching: Future[list[FetchResult]] = Future()
    failure = UserCodeFailure("ValueError", "bad record", "trace")
    hand_out(finished([(ProcessResult(0, {}, None), failure)]), processing, fetching)
    assert processing.result() == [ProcessResult(0, {}, None)]
    with pytest.raises(UserFunctionError, match="ValueError: bad record"):
        fetching.result()


def test_a_failed_job_fails_both_stages_and_a_round_without_a_stage_has_no_future() -> None:
    whole: Future[list[tuple[ProcessOutcome, FetchOutcome]]] = Future()
    whole.set_exception(RuntimeError("task lost"))
    processing: Future[list[ProcessResult]] = Future()
    hand_out(whole, processing, None)
    with pytest.raises(RuntimeError, match="task lost"):
        processing.result()


def test_stage_1_is_called_once_stage_2_is_queued_and_only_once() -> None:
    calls: list[str] = []
    fetching: Future[list[FetchResult]] = Future()
    chain = ChainedStage(lambda: calls.append("stage 1"), fetching)
    chain.queued()
    ended: Future[object] = Future()
    ended.set_result([])
    chain.ended(ended)  # stage 2's call ended after its parts were queued
    chain.queued()
    assert calls == ["stage 1"]
    assert not fetching.done()  # stage 1's own call hands its results out


def test_stage_1_fails_with_stage_2_when_its_parts_were_never_queued() -> None:
    calls: list[str] = []
    fetching: Future[list[FetchResult]] = Future()
    chain = ChainedStage(lambda: calls.append("stage 1"), fetching)
    ended: Future[object] = Future()
    ended.set_exception(RuntimeError("resident tasks unavailable: the resident tasks ended"))
    chain.ended(ended)
    chain.queued()
    assert calls == []
    with pytest.raises(RuntimeError, match="resident tasks unavailable"):
        fetching.result(0)
