"""A class-data-sharing archive of the Spark driver's classes, so that an agent starts sooner.

A Spark driver JVM loads and verifies some 19,000 classes of Spark, Scala and Catalyst before
its first results (counted with ``-Xlog:class+load``; the JDK's own archive holds 1,200 of
them). Java 17 can dump the classes one run loaded into an archive
(``-XX:ArchiveClassesAtExit``) and map them from it in later runs (``-XX:SharedArchiveFile``),
already parsed and verified. Measured here (2 cores, Java 17, PySpark 4.3), runs taken turn
about: a session with the agent's settings to its first RDD result, 13.0-13.3 s without the
archive and 8.4-8.5 s with it; a session and its first SQL and RDD results, 17-19 s and 11-12 s.

``make install`` builds the archive once into the environment (``python -m
sparkpoint.agent.spark.class_archive``); every Spark session the agent starts maps it when the file is
there. The JVM checks that the archive matches its own build and class path and runs without it
otherwise (a newer Java, other Spark jars): that only costs the seconds again, and building it
once more brings them back. ``SPARKPOINT_SPARK_CLASS_ARCHIVE`` names another file, or ``off``.
A driver that does not start with the archive (one damaged since, see below) starts again
without it, with a warning (``spark.spark_session``).

Only the driver uses it: executors on a cluster run another class path on other machines.

An archive cut short crashes the JVM that maps it (SIGBUS, measured), so it is never written in
place: the JVM dumps into a temporary file at its exit, a Spark session in a process of its own
maps that file and runs a job (``verify``), and only then is it renamed over the archive. A JVM
that maps the old file keeps its mapping.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sparkpoint.agent.spark.archive import ARCHIVE_ENV, DRIVER_JAVA_OPTIONS, archive_path

ROOT = Path(__file__).resolve().parents[3]
"""The directory holding the ``sparkpoint`` package, for the process ``verify`` starts."""

DUMP_TIMEOUT_S = 300.0
"""How long the JVM may take to write the archive once it exits (about 190 MB here)."""


def build(archive: Path, master: str = "local[2]") -> int:
    """Starts a Spark session that dumps its classes at exit, runs the kinds of work an agent
    runs (RDD jobs with Python workers, Arrow to and from pandas, SQL, Parquet), stops the JVM,
    waits for its dump, checks it with ``verify`` and puts it in place. Returns the archive's
    size in bytes."""
    from pyspark import SparkContext

    from sparkpoint.agent.spark.session import spark_session

    archive = archive.absolute()  # the JVM that verifies it runs in another directory
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    settings = {DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"}
    try:
        session: Any = spark_session("sparkpoint-class-archive", master, settings, False)
        try:
            _warm_up(session)
        finally:
            session.stop()
            gateway: Any = SparkContext._gateway  # the JVM's process is only here
            process: subprocess.Popen[bytes] = gateway.proc
            gateway.shutdown()
            process.stdin.close()  # type: ignore[union-attr]  # the JVM exits at its input's end
            process.wait(DUMP_TIMEOUT_S)
        if process.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"the Spark JVM exited with {process.returncode} and no archive")
        verify(partial, master)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)  # whatever failed: a dump, whole or not, is not kept
    return archive.stat().st_size


VERIFY = """
import sys
from pathlib import Path
from sparkpoint.agent.spark.archive import with_archive
from sparkpoint.agent.spark.session import QUIET_DEFAULTS, start_session
settings = with_archive(QUIET_DEFAULTS, Path(sys.argv[2]))
session = start_session("sparkpoint-class-archive-check", sys.argv[1], settings)
session.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()
pid = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getPid()
maps = Path(f"/proc/{pid}/maps")
print("mapped" if not maps.exists() or sys.argv[2] in maps.read_text() else "refused")
"""
"""Run in a process of its own (a JVM maps one archive, when it starts), with no second try
without the archive as ``spark_session`` makes."""

VERIFY_TIMEOUT_S = 300.0


def verify(archive: Path, master: str = "local[2]") -> None:
    """Starts a Spark session that maps ``archive`` in a process of its own and runs a job: an
    archive that crashes the JVM (one cut short does) or that the JVM refuses (another Java build
    or class path) raises, so that it is never put where agents would map it."""
    archive = archive.absolute()  # the session runs in a directory of its own
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as directory:  # where a crashed JVM leaves its report
        result = subprocess.run(
            [sys.executable, "-c", VERIFY, master, str(archive)],
            cwd=directory, env=env, capture_output=True, text=True, timeout=VERIFY_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    answer = result.stdout.strip().splitlines()[-1:] if result.returncode == 0 else []
    if answer == ["refused"]:
        raise RuntimeError(f"the JVM does not map {archive}: another Java build or class path")
    if answer != ["mapped"]:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"a Spark session with {archive} failed ({detail})")


def _warm_up(session: Any) -> None:
    import pandas as pd

    sc = session.sparkContext
    sc.parallelize(range(1_000), 2).mapPartitions(lambda rows: [sum(rows)]).collect()
    frame = session.createDataFrame(pd.DataFrame({"key": ["a", "b"] * 50, "value": range(100)}))
    frame.groupBy("key").sum("value").toPandas()
    with tempfile.TemporaryDirectory() as directory:
        frame.write.parquet(f"{directory}/part")
        session.read.parquet(f"{directory}/part").selectExpr("value + 1 AS v").collect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkpoint.agent.spark.class_archive",
        description="Builds the Spark driver's class-data-sharing archive (agents start sooner).",
    )
    parser.add_argument(
        "path", nargs="?", type=Path, help=f"default: {ARCHIVE_ENV} or beside pyspark"
    )
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    archive = args.path or archive_path()
    if archive is None:
        print(f"{ARCHIVE_ENV}=off: no archive to build", file=sys.stderr)
        return 0
    size = build(archive, args.master)
    print(f"Spark driver class archive: {archive} ({size / 1e6:.0f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
