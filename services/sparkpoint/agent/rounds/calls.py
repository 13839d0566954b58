"""How a round's parts run (`rounds.Rounds` plans them): one Spark job with both stages' parts,
or, on resident tasks, one call per stage, stage 2's parts queued first so that its results are
collected as soon as they end; and how a call's results reach the two stages' futures."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import zip_longest
from typing import Any

from sparkpoint.agent.job import KeyedFunction, MapFunction
from sparkpoint.agent.rounds.fetch import FetchResult, FetchTask, fetch_and_partition
from sparkpoint.agent.rounds.process import ProcessResult, ProcessTask, process_subtask
from sparkpoint.agent.rounds.user_code import UserCodeFailure, guarded, unless_user_failed
from sparkpoint.agent.spark.jobs import ROUNDS_POOL, SparkJobs


@dataclass(frozen=True)
class RoundTask:
    """One Spark task of a round: a subtask's stage-2 part, then a source subtask's stage-1
    part, either of them absent."""

    process: ProcessTask | None
    fetch: list[FetchTask]


ProcessOutcome = ProcessResult | UserCodeFailure | None
FetchOutcome = list[FetchResult] | UserCodeFailure | None


class ChainedStage:
    """Stage 1's call of a round on resident tasks, made once stage 2's parts are queued (so
    they go first), from whichever thread; if stage 2's call ends without queueing them (the
    resident tasks could not be had), stage 1 fails with it, as both stages of a Spark job do."""

    def __init__(
        self, call: Callable[[], object], fetching: Future[list[FetchResult]] | None
    ) -> None:
        self.call = call
        self.fetching = fetching
        self.lock = threading.Lock()
        self.settled = False

    def _first(self) -> bool:
        with self.lock:
            first, self.settled = not self.settled, True
        return first

    def queued(self) -> None:
        if self._first():
            self.call()

    def ended(self, whole: Future[Any]) -> None:
        if self._first() and self.fetching is not None:
            failure = whole.exception() or RuntimeError("stage 2's parts were never queued")
            self.fetching.set_exception(failure)


def run_round_task(
    task: RoundTask, keyed_function: KeyedFunction, map_function: MapFunction
) -> tuple[ProcessOutcome, FetchOutcome]:
    """A round's task: its stage-2 part (whose at-least-once output is visible at its end),
    then its stage-1 part (reading what arrived meanwhile, within the planned ends)."""
    processed = (
        guarded(process_subtask, task.process, keyed_function) if task.process is not None else None
    )
    fetched = guarded(fetch_and_partition, task.fetch, map_function) if task.fetch else None
    return processed, fetched


def round_tasks(
    process: list[ProcessTask], fetch: list[list[FetchTask]], cores: int
) -> list[RoundTask]:
    """The round's parts as tasks: each part a task when the cores take them all at once, else
    a stage-2 part and a stage-1 part to a task (the job then has as many tasks as its larger
    stage)."""
    if len(process) + len(fetch) <= cores:
        return [RoundTask(p, []) for p in process] + [RoundTask(None, f) for f in fetch]
    return [RoundTask(p, f or []) for p, f in zip_longest(process, fetch)]


class RoundCalls:
    """Runs rounds' parts on a runner of two threads (a call blocks its thread until its parts
    end): one Spark job per round, or a call per stage on resident tasks."""

    def __init__(
        self,
        job_id: str,
        keyed_function: KeyedFunction,
        map_function: MapFunction,
        jobs: SparkJobs,
        wake: Callable[[], None],
    ) -> None:
        self.job_id = job_id
        self.work = partial(
            run_round_task, keyed_function=keyed_function, map_function=map_function
        )
        """What each part runs: the same function for every call."""
        self.jobs = jobs
        self.wake = wake
        """Called once a call's results are handed out (the loop then collects them at once)."""
        self.runner = ThreadPoolExecutor(2, thread_name_prefix="rounds")

    def submit(
        self, process: list[ProcessTask], fetch: list[list[FetchTask]]
    ) -> tuple[Future[list[ProcessResult]] | None, Future[list[FetchResult]] | None]:
        """Runs the round's parts: one Spark job, or, on resident tasks, each stage as a call
        of its own, stage 1's queued once stage 2's parts are (or once stage 2's call ended
        without queueing them), so that stage 2's results are collected as soon as its parts end,
        not once stage 1's reads end too: its output is staged a read sooner, and the first
        output of a start comes sooner. Returns each stage's future; nothing here waits."""
        processing: Future[list[ProcessResult]] | None = Future() if process else None
        fetching: Future[list[FetchResult]] | None = Future() if fetch else None
        described = (
            f"{self.job_id} round: {len(process)} subtasks, {sum(len(f) for f in fetch)} partitions"
        )
        if not self.jobs.resident:
            tasks = round_tasks(process, fetch, self.jobs.cores())
            self._call(described, tasks, processing, fetching)
            return processing, fetching
        stage_1 = [RoundTask(None, f) for f in fetch]
        stage_2 = [RoundTask(p, []) for p in process]
        if stage_1 and stage_2:
            chain = ChainedStage(partial(self._call, described, stage_1, None, fetching), fetching)
            whole = self._call(described, stage_2, processing, None, False, chain.queued)
            whole.add_done_callback(chain.ended)
        elif stage_2:
            self._call(described, stage_2, processing, None)
        else:
            self._call(described, stage_1, None, fetching)
        return processing, fetching

    def _call(
        self,
        description: str,
        tasks: list[RoundTask],
        processing: Future[list[ProcessResult]] | None,
        fetching: Future[list[FetchResult]] | None,
        timed: bool = True,
        queued: Callable[[], None] | None = None,
    ) -> Future[list[tuple[ProcessOutcome, FetchOutcome]]]:
        """One call of round parts on the runner, its results handed to the stages' futures;
        ``queued`` is called once the parts wait for resident tasks."""
        whole: Future[list[tuple[ProcessOutcome, FetchOutcome]]] = self.runner.submit(
            self.jobs.run, ROUNDS_POOL, description, tasks, self.work,
            "rounds" if timed else None, queued,
        )  # fmt: skip
        whole.add_done_callback(partial(self._handed_out, processing, fetching))
        return whole

    def _handed_out(
        self,
        processing: Future[list[ProcessResult]] | None,
        fetching: Future[list[FetchResult]] | None,
        done: Future[list[tuple[ProcessOutcome, FetchOutcome]]],
    ) -> None:
        hand_out(done, processing, fetching)
        self.wake()

    def shutdown(self) -> None:
        self.runner.shutdown(wait=True)


def hand_out(
    whole: Future[list[tuple[ProcessOutcome, FetchOutcome]]],
    processing: Future[list[ProcessResult]] | None,
    fetching: Future[list[FetchResult]] | None,
) -> None:
    """Hands a finished round's results to its parts' futures: the stage-2 results in subtask
    order, the stage-1 results flattened. The job failing fails both; the job's own function
    raising in a part (`UserFunctionError`) fails that stage's future."""
    try:
        results = whole.result()
    except BaseException as exc:
        for future in (processing, fetching):
            if future is not None:
                future.set_exception(exc)
        return
    if processing is not None:
        try:
            processing.set_result(unless_user_failed([p for p, _ in results if p is not None]))
        except BaseException as exc:
            processing.set_exception(exc)
    if fetching is not None:
        try:
            reads = unless_user_failed([f for _, f in results if f is not None])
            fetching.set_result([r for each in reads for r in each])
        except BaseException as exc:
            fetching.set_exception(exc)
