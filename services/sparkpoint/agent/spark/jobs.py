"""The agent's Spark jobs: one SparkContext, started on first use (or a session handed in: tests
and benchmarks share theirs), and every job the agent runs on it, each tagged in a job group of
its own (what the driver ships to tasks and gets back is counted: `traffic`) and in one of the
scheduler pools of spark_pools.xml: `ROUNDS_POOL`, `RECOVERY_POOL`, `SINK_POOL`,
`SNAPSHOT_POOL`.

On a local master of a session the agent started itself, the same work runs in resident tasks
instead (`resident`): long-running Spark tasks, one per slot, that take the agent's tasks as
they come, with the pools' order kept. A session handed in is shared (other jobs need its
slots), so it keeps a Spark job per call unless the caller asks for resident tasks."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

from sparkpoint.agent.spark.preload import preload
from sparkpoint.agent.spark.resident import SETTING, ResidentWorkers, local_slots
from sparkpoint.agent.spark.traffic import DriverTraffic
from sparkpoint.agent.spark.worker_gc import in_task

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

ROUNDS_POOL = "stage2"
"""The rounds' pool (named when stage 1 ran in a pool of its own: a pools file written for it
still applies)."""
RECOVERY_POOL = "recovery"
SNAPSHOT_POOL = "snapshot"
"""Canonical savepoints' folds: beside the rounds, which go on meanwhile."""
SINK_POOL = "sink"
"""Sorts before `ROUNDS_POOL`: Spark's FAIR comparison takes the first name between pools
running equally many tasks (spark_pools.xml says why that matters)."""


class SparkJobs:
    def __init__(
        self,
        app_name: str,
        master: str,
        settings: Mapping[str, str],
        spark: Any = None,
        resident: bool | None = None,
    ) -> None:
        self.app_name = app_name
        self.master = master
        self.settings = dict(settings)
        self._session = spark
        self._context: Any = None if spark is None else spark.sparkContext
        self._session_lock = threading.Lock()
        """Held while Spark starts: a caller on another thread waits for that one."""
        self._warming: Future[None] | None = None
        self.traffic = DriverTraffic()
        self.stage_seconds: dict[str, float] = {"rounds": 0.0}
        """Wall time inside the rounds' Spark jobs."""
        if resident is None:
            resident = spark is None and self.settings.get(SETTING, "true").lower() != "false"
        self._resident_wanted = resident
        """Resident tasks on a local master (`resident`): by default when this agent starts
        the session, unless ``spark.sparkpoint.residentTasks`` is false."""
        self._resident: ResidentWorkers | None = None
        self._resident_lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._context is not None

    def session(self) -> Any:
        """A SparkSession over `context`, made when first asked for: the agent's own work needs
        none (`spark_context` says what one costs)."""
        with self._session_lock:
            if self._session is None:
                self._started()
                from pyspark.sql import SparkSession

                self._session = SparkSession.builder.getOrCreate()
            return self._session

    @property
    def local(self) -> bool:
        """The executors run on the driver's machine (``local``, ``local[N]``), without starting
        Spark to find out."""
        master = self.master if self._context is None else self._context.master
        return str(master).startswith("local")

    @property
    def context(self) -> Any:
        """The SparkContext, started on first use."""
        with self._session_lock:
            return self._started()

    def _started(self) -> Any:
        """The SparkContext, started if need be (under the lock)."""
        if self._context is None:
            from sparkpoint.agent.spark.session import spark_context

            self._context = spark_context(self.app_name, self.master, self.settings)
        return self._context

    def cores(self) -> int:
        """The task slots Spark has now (``local[N]``: N; a cluster: its executors' cores)."""
        return int(self.context.defaultParallelism)

    def start_warm_up(self, parallelism: int) -> None:
        """Starts `warm_up`'s work on a thread of its own and returns at once: what the caller
        does meanwhile (reading what it restores, its source's positions) overlaps Spark's start.
        `warm_up` waits for it; a caller of `session` on another thread waits for the session."""
        if self._warming is not None:
            return
        warming = self._warming = Future()

        def warm() -> None:
            try:
                self._warm(parallelism)
            except BaseException as exc:
                warming.set_exception(exc)
            else:
                warming.set_result(None)

        threading.Thread(target=warm, name="spark-warm-up", daemon=True).start()

    def warm_up(self, parallelism: int) -> None:
        """Starts Spark and its Python workers, which import what the agent's tasks need (a
        session takes 2-4 s to its first result, a worker about 0.5 s to its imports, and
        nothing that follows should wait for them); a task per task slot, at least
        ``parallelism``. Waits for the warm-up `start_warm_up` started, and raises what it
        raised."""
        self.start_warm_up(parallelism)
        assert self._warming is not None
        self._warming.result()

    def settle(self) -> None:
        """Waits for a warm-up in flight, whatever its outcome: the caller is closing (a job
        that could not start), and a Spark left starting would write its start-up lines after
        the caller's last word."""
        if self._warming is not None:
            with contextlib.suppress(BaseException):
                self._warming.result()

    @property
    def resident(self) -> bool:
        """Whether the work runs in resident tasks (wanted, and the master is a local one)."""
        return self._resident_wanted and self._slots is not None

    @functools.cached_property
    def _slots(self) -> int | None:
        """The local master's task slots (None: not a local master), looked up once: asking
        the JVM takes milliseconds."""
        sc = self.context
        return local_slots(str(sc.master), int(sc.getConf().get("spark.task.cpus", "1")))

    def _workers(self) -> ResidentWorkers:
        """The resident workers, started when there are none or the last ones are gone (a
        worker died, a failed attempt's work was cancelled)."""
        with self._resident_lock:
            workers = self._resident
            if workers is None or workers.broken is not None:
                slots = self._slots
                assert slots is not None
                workers = ResidentWorkers(self.context, slots, self.traffic.add_call)
                workers.start()
                self._resident = workers
            return workers

    def close(self) -> None:
        """Lets the resident workers go (their slots free for other jobs of a shared session)."""
        with self._resident_lock:
            workers, self._resident = self._resident, None
        if workers is not None:
            workers.close()

    def _warm(self, parallelism: int) -> None:
        if self.resident:  # the resident tasks import what tasks need before they connect
            self._workers()
            return
        sc = self.context
        sc.setJobDescription("warm-up")
        tasks = max(parallelism, self.cores())
        sc.parallelize(range(tasks), tasks).map(preload).collect()

    def run(
        self,
        pool: str,
        description: str,
        tasks: list[T],
        work: Callable[[T], R],
        timed: str | None = None,
        queued: Callable[[], None] | None = None,
    ) -> list[R]:
        """Runs ``work`` over ``tasks`` as one Spark job (a task each) in the scheduler pool
        ``pool``, or as tasks of the resident workers; ``timed``: the `stage_seconds` entry its
        wall time adds to; ``queued``: called once the tasks wait for slots (resident tasks)."""
        started = time.monotonic()
        if self.resident:
            results: list[R] = self._workers().run(pool, tasks, work, queued)
        else:
            sc = self.context
            sc.setLocalProperty("spark.scheduler.pool", pool)
            self.traffic.start_job(sc, description, tasks)
            results = sc.parallelize(tasks, len(tasks)).map(partial(in_task, work)).collect()
        if timed is not None:
            self.stage_seconds[timed] += time.monotonic() - started
        return results

    def cancel_open(self) -> None:
        """Cancels the jobs still running (a failed attempt's rounds, a split being redone); the
        resident workers' job too when a task still runs or waits (the next call starts new
        ones)."""
        workers = self._resident
        if workers is not None and workers.busy:
            workers.cancel("a failed attempt's tasks were cancelled")
        if self._context is not None:
            with contextlib.suppress(Exception):
                self.traffic.cancel_open(self._context)

    def report_traffic(self, job_id: str, input_bytes: int) -> None:
        """Logs the bytes the driver shipped to and got from tasks per input byte."""
        if self._context is None or not input_bytes:
            return
        with contextlib.suppress(Exception):  # a figure, not worth failing a close for
            self.traffic.settle(self._context, wait_s=2.0)
            log.info(
                "job %s: %d input bytes; the driver shipped %d bytes to tasks and got %d "
                "back (%.4f per input byte)",
                job_id, input_bytes, self.traffic.to_tasks, self.traffic.from_tasks,
                self.traffic.total / input_bytes,
            )  # fmt: skip
