"""The agent's Spark: a SparkContext (`spark_context`; a SparkSession over it only for callers
that ask, `spark_session`), ``local[*]`` by default, any master with ``--master``, Spark settings
passed through. Defaults are the quiet, fast settings measured on a 2-core machine (no UI, no
console progress, 2 shuffle partitions, no adaptive execution, bound to loopback, a 2 GB
driver, the FAIR scheduler for the rounds, recovery and sink pools, Python workers over Unix
domain sockets, the driver JVM's client compiler only, on a local master a workers' daemon
importing pyspark compiled: daemon.py); a ``spark.*`` setting given by the caller replaces any
of them. The driver maps the class archive of class_archive.py when it
exists (a session gets to its first results 4-7 s sooner).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkpoint.agent.spark import daemon
from sparkpoint.agent.spark.archive import (
    ARCHIVE_ENV,
    DRIVER_JAVA_OPTIONS,
    archive_path,
    with_archive,
)
from sparkpoint.common.redaction import SECRET_KEY
from sparkpoint.common.topics import PREFIX_ENV, topic_prefix

log = logging.getLogger(__name__)

QUIET_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # a round, recovery's filter jobs and the sink's jobs run concurrently, sharing the cores
    "spark.scheduler.mode": "FAIR",
    # the executor reaches its Python workers over Unix domain sockets: over loopback TCP each
    # task's exchange with its worker waited about 40 ms more (measured: a 2-task PySpark job
    # 75 -> 36 ms p50, 4 tasks 125 -> 49 ms)
    "spark.python.unix.domain.socket.enabled": "true",
    # the driver's JVM schedules and pipes; it computes nothing of a job's records (Python
    # does): its client compiler alone (C1) costs less CPU per Spark job than C1 and C2 (a
    # 2-task job, warm: 41-47 -> 31 ms of JVM CPU; 63 against 110 ms while warming up) and
    # starts a session sooner (5.4 -> 3.4-3.8 s)
    DRIVER_JAVA_OPTIONS: "-XX:TieredStopAtLevel=1",
}

LOG_LEVEL = "ERROR"

POOLS = Path(__file__).with_name("spark_pools.xml")
"""The rounds', recovery's and the sink's pools (the file says why)."""


def spark_session(
    app_name: str,
    master: str = "local[*]",
    settings: Mapping[str, str] | None = None,
    class_archive: bool = True,
) -> object:
    """A SparkSession (returned as ``object`` so importing this module does not import pyspark)
    over `spark_context`'s context."""
    from pyspark.sql import SparkSession

    spark_context(app_name, master, settings, class_archive)
    return SparkSession.builder.getOrCreate()


def spark_context(
    app_name: str,
    master: str = "local[*]",
    settings: Mapping[str, str] | None = None,
    class_archive: bool = True,
) -> Any:
    """A SparkContext with the quiet defaults under the caller's settings, and no SparkSession:
    the agent's work needs none, and creating one costs the driver 0.7-0.85 s more (measured
    here with the class archive: the JVM's gateway 1.0 s, the context 0.85-1.0 s, a session
    over it 0.72-0.85 s, the first job 1.2-1.4 s). The driver maps the class archive ``make
    install`` built (class_archive.py), when there is one. A driver `launch_driver` started is
    taken over (this waits for it)."""
    from pyspark.errors import PySparkRuntimeError

    chosen, mapped = session_settings(settings, class_archive, master)
    try:
        sc = start_context(app_name, master, mapped)
    except PySparkRuntimeError as exc:  # the driver's JVM exited before it answered
        if mapped == chosen:
            raise
        log.warning(
            "the Spark driver did not start with the class archive %s (%s); starting it "
            "without: build the archive again (python -m sparkpoint.agent.spark.class_archive) or "
            "set %s=off", archive_path(), exc, ARCHIVE_ENV,
        )  # fmt: skip
        sc = start_context(app_name, master, {DRIVER_JAVA_OPTIONS: "", **chosen})
    sc.setLogLevel(LOG_LEVEL)
    return sc


def session_settings(
    settings: Mapping[str, str] | None, class_archive: bool = True, master: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The quiet defaults under the caller's ``settings``, without and with the class archive
    mapped (the same as the first when there is none). On a local ``master`` the Python
    workers' daemon imports pyspark compiled (daemon.py)."""
    chosen = {**QUIET_DEFAULTS, **(settings or {})}
    if master is not None and master.startswith("local"):
        chosen.setdefault(daemon.SETTING, daemon.MODULE)
    # Spark's UI environment page and event log show a matching key's value as redacted: the
    # same keys as sparkpoint's own pages (Spark's default misses JAAS lines and key passwords)
    chosen.setdefault("spark.redaction.regex", SECRET_KEY.pattern)
    # the executors' Kafka clients take the driver's topic prefix (their assign-only group,
    # `<prefix>unassigned-<pid>`, is what a prefixed ACL grants: docs/security.md)
    chosen.setdefault(f"spark.executorEnv.{PREFIX_ENV}", topic_prefix())
    # a URI: a bare path would resolve against the cluster's default file system (HDFS)
    chosen.setdefault("spark.scheduler.allocation.file", POOLS.resolve().as_uri())
    return chosen, with_archive(chosen, archive_path() if class_archive else None)


_launching: list[threading.Thread] = []


def launch_driver(
    master: str = "local[*]", settings: Mapping[str, str] | None = None, class_archive: bool = True
) -> None:
    """Starts the Spark driver's JVM in a thread of its own and returns at once, so that what
    the process does next (importing the agent and the job, reaching Kafka) overlaps the JVM's
    start (about 0.8 s here). `spark_session` with the same ``master`` and ``settings`` takes it
    over; once per process. A driver that fails to start is not reported here: the session
    starts it again, and reports it, or falls back as it does without this."""
    if _launching:
        return
    from pyspark import SparkConf

    _, mapped = session_settings(settings, class_archive, master)
    conf = SparkConf(loadDefaults=False).setAll(list(mapped.items())).setMaster(master)
    _worker_environment()

    def launch() -> None:
        from pyspark import SparkContext

        try:
            SparkContext._ensure_initialized(conf=conf)
        except Exception as exc:  # the session reports it (or falls back) when it starts
            log.debug("launching the Spark driver ahead failed: %s", exc)

    _launching.append(threading.Thread(target=launch, name="spark-driver-launch", daemon=True))
    _launching[0].start()


def abandon_launched_driver(timeout_s: float = 30.0) -> None:
    """Ends the JVM `launch_driver` started when no session took it over (the job could not be
    loaded, the agent refused to start): it would otherwise outlive the command and write its
    start-up lines after the command's error. Waits for the launch to finish first."""
    if not _launching:
        return
    _launching[0].join(timeout_s)
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None or SparkContext._active_spark_context is not None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        proc.kill()
        proc.wait(10)
    SparkContext._gateway = None
    SparkContext._jvm = None


def _worker_environment() -> None:
    """Workers run this interpreter: ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to
    it unless already set, or executors would import another Python without sparkpoint."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver binds to loopback anyway


def start_session(app_name: str, master: str, settings: Mapping[str, str]) -> Any:
    """A SparkSession with exactly ``settings``: no defaults added, nothing tried again
    (`_worker_environment` set first)."""
    from pyspark.sql import SparkSession

    start_context(app_name, master, settings)
    return SparkSession.builder.getOrCreate()


def start_context(app_name: str, master: str, settings: Mapping[str, str]) -> Any:
    """A SparkContext with exactly ``settings`` over the defaults of ``spark-submit`` (as
    ``SparkSession.builder`` makes one): no defaults of ours added, nothing tried again
    (`_worker_environment` set first)."""
    _worker_environment()
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAll(list(settings.items())).setAppName(app_name).setMaster(master)
    return SparkContext.getOrCreate(conf)
