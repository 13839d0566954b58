"""Starting Spark ahead (services/sparkpoint/agent/spark/session.py): `sparkpoint agent` launches the
driver's JVM before it imports the agent and the job (`launch_driver`), and the session the agent
starts later takes that JVM over instead of launching another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
