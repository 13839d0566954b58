"""Starting Spark (services/sparkpoint/agent/spark/session.py): `sparkpoint agent` launches the
driver's JVM before it imports the agent and the job (`launch_driver`), and the context the agent
starts later takes that JVM over instead of launching another; the agent's Spark is a context
without a session, and on a local master its workers import pyspark compiled (daemon.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.agent.spark import daemon, session
from sparkpoint.agent.spark.archive import ARCHIVE_ENV, archive_path
from sparkpoint.agent.spark.class_archive import ROOT

PROGRAM = """
import os
from pathlib import Path
from pyspark import SparkContext
from sparkpoint.agent.spark import session

settings = {"spark.driver.memory": "700m"}
session.launch_driver("local[1]", settings)
session._launching[0].join(120)
launched = SparkContext._gateway
print("launched", launched is not None)
spark = session.spark_session("ahead", "local[1]", settings)
print("taken over", spark.sparkContext._gateway is launched)
bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("arguments", " ".join(bean.getInputArguments()))
children = [
    pid
    for task in Path(f"/proc/{os.getpid()}/task").iterdir()
    for pid in (task / "children").read_text().split()
]
print("java children", sum(b"java" in Path(f"/proc/{p}/cmdline").read_bytes() for p in children))
print("sum", spark.sparkContext.parallelize(range(4)).sum())
"""


@pytest.mark.spark
def test_the_session_takes_over_the_driver_launched_ahead_with_its_settings(
    tmp_path: Path,
) -> None:
    """One JVM: the one `launch_driver` started before any session was asked for, launched
    with the session's settings (a setting only a launch applies: the driver's heap; the class
    archive `make install` built), and it runs the session's jobs."""
    archive = archive_path()
    assert archive is not None and archive.is_file(), "`make install` builds it"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(ARCHIVE_ENV, None)

    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["launched"] == "True", "the JVM was not up before the session was asked for"
    assert lines["taken"] == "over True", "the session launched a JVM of its own"
    assert "-Xmx700m" in lines["arguments"].split()
    assert f"-XX:SharedArchiveFile={archive}" in lines["arguments"].split()
    assert lines["java"] == "children 1"
    assert lines["sum"] == "6"


AGENTS_SPARK = """
import sys
import pyspark
from pyspark.sql import SparkSession
from sparkpoint.agent.spark.jobs import ROUNDS_POOL, SparkJobs


def imported_from(_):
    import sys
    return [sys.modules[name].__file__ for name in ("pyspark", "py4j")]


jobs = SparkJobs("sparkpoint t", "local[1]", {})
context = jobs.context
print("daemon", context.getConf().get("spark.python.daemon.module"))
print("resident", jobs.resident)
pyspark_file, py4j_file = jobs.run(ROUNDS_POOL, "imports", [0], imported_from)[0]
print("pyspark", pyspark_file)
print("py4j", py4j_file)
print("installed", pyspark.__file__)
jvm_session = context._jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
print("sessions", SparkSession._instantiatedSession is None and jvm_session.isEmpty())
session = jobs.session()
print("over", session.sparkContext is context and jobs.session() is session)
jobs.close()  # the resident task lets its slot go
print("sum", session.range(4).groupBy().sum("id").collect()[0][0])
"""


@pytest.mark.spark
def test_the_agent_starts_a_context_alone_whose_workers_import_pyspark_compiled(
    tmp_path: Path,
) -> None:
    """The agent's Spark is a SparkContext with no SparkSession (0.7-0.85 s less to its first
    job), and on a local master its Python workers' daemon (daemon.py) imports pyspark and
    py4j from the installed packages, compiled, not from the source zips Spark puts first on
    their path; a session made later goes over the same context."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    result = subprocess.run(
        [sys.executable, "-c", AGENTS_SPARK], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=240, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["daemon"] == daemon.MODULE
    assert lines["resident"] == "True", "the task ran in a resident worker, forked by the daemon"
    assert lines["pyspark"] == lines["installed"], "the worker imported pyspark from its zip"
    assert ".zip" not in lines["py4j"] and lines["py4j"].endswith("/py4j/__init__.py")
    assert lines["sessions"] == "True", "a SparkSession was made before one was asked for"
    assert lines["over"] == "True"
    assert lines["sum"] == "6"


def shipped(site: Path, py4j_installed: str | None = "0.10.9.9") -> list[str]:
    """A pip-installed pyspark's layout under ``site``: the package, its zips, py4j's
    dist-info (of ``py4j_installed``); returns the zips' paths."""
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zips = [lib / "pyspark.zip", lib / "py4j-0.10.9.9-src.zip"]
    for zip_path in zips:
        zip_path.write_bytes(b"")
    if py4j_installed:
        (site / f"py4j-{py4j_installed}.dist-info").mkdir()
    return [str(z) for z in zips]


def test_the_zips_of_an_installed_pyspark_go_after_its_package_and_others_stay(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = shipped(site)
    path = ["", pyspark_zip, py4j_zip, "/jobs/files", str(site)]
    assert daemon.installed_first(path) == ["", "/jobs/files", str(site), pyspark_zip, py4j_zip]

    assert daemon.installed_first([pyspark_zip, py4j_zip]) == [pyspark_zip, py4j_zip], (
        "the package is not importable from this path: Spark's order stays"
    )
    other = tmp_path / "other"
    pyspark_zip, py4j_zip = shipped(other, py4j_installed="0.10.9.7")
    assert daemon.installed_first([pyspark_zip, py4j_zip, str(other)]) == [
        py4j_zip, str(other), pyspark_zip,
    ], "py4j of another version installed: its zip stays first"  # fmt: skip
    distribution = tmp_path / "spark-4.3.0-bin" / "python" / "lib" / "pyspark.zip"
    assert daemon.installed_first([str(distribution), "/x"]) == [str(distribution), "/x"]


def test_the_daemon_is_ours_on_a_local_master_only_and_a_setting_of_the_users_wins() -> None:
    assert session.session_settings(None, False, "local[2]")[0][daemon.SETTING] == daemon.MODULE
    assert daemon.SETTING not in session.session_settings(None, False, "spark://h:7077")[0]
    theirs = {daemon.SETTING: "their.daemon"}
    assert session.session_settings(theirs, False, "local[*]")[0][daemon.SETTING] == "their.daemon"


WORKER_WHOSE_JVM_WENT_AWAY = """
import socket, sys
from sparkpoint.agent.spark.daemon import quietly_when_the_driver_is_gone

mine, theirs = socket.socketpair()
theirs.close()  # the JVM's end of the worker's socket: gone


def worker(sock, authenticated):  # what PySpark's daemon runs in a forked worker
    out = sock.makefile("wb")
    out.write(b"x" * 65536)
    out.flush()
    return 0


run = quietly_when_the_driver_is_gone(worker) if sys.argv[1] == "quiet" else worker
run(mine, False)
print("not reached")
"""


@pytest.mark.parametrize("wrapped", [True, False], ids=["ours", "pyspark's"])
def test_a_worker_whose_jvm_went_away_ends_without_a_traceback(wrapped: bool) -> None:
    """An agent that cannot start exits while its workers warm up: a worker then writes to a
    closed socket. PySpark's daemon would print the broken pipe's traceback after the agent's
    one-line error; ours ends the worker with the same code, saying nothing."""
    result = subprocess.run(
        [sys.executable, "-c", WORKER_WHOSE_JVM_WENT_AWAY, "quiet" if wrapped else "as-is"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    if wrapped:
        assert result.stderr == ""
    else:
        assert "BrokenPipeError" in result.stderr, "the scenario raises what PySpark would print"
