"""The Spark driver's class archive (services/sparkpoint/agent/spark/class_archive.py): `make install` builds it,
every session the agent starts maps it, a caller's own driver Java options stay, and an archive
that crashes the JVM is neither installed nor, once damaged, in the way of a session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.agent.spark.archive import (
    ARCHIVE_ENV,
    DEFAULT_ARCHIVE,
    DRIVER_JAVA_OPTIONS,
    archive_path,
    with_archive,
)
from sparkpoint.agent.spark.class_archive import ROOT, verify


@pytest.mark.spark
def test_the_drivers_jvm_maps_the_archive_make_install_built(spark: Any) -> None:
    archive = archive_path()
    assert archive is not None and archive.is_file(), f"no {archive}: `make install` builds it"
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    maps = Path(f"/proc/{runtime.getPid()}/maps").read_text()
    assert str(archive) in maps, "the JVM refused the archive (another Java or Spark build?)"


@pytest.mark.spark
def test_the_drivers_jvm_compiles_with_its_client_compiler_only(spark: Any) -> None:
    """session.py's default: the driver's JVM schedules and pipes, and C1 alone costs it less
    CPU per Spark job than C1 and C2."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert "-XX:TieredStopAtLevel=1" in list(runtime.getInputArguments())


def test_a_callers_driver_java_options_come_first_and_stay(tmp_path: Path) -> None:
    archive = tmp_path / "spark-driver.jsa"
    archive.write_bytes(b"archive")
    own = {DRIVER_JAVA_OPTIONS: "-Dmine=1", "spark.ui.enabled": "false"}

    chosen = with_archive(own, archive)

    assert chosen == {
        DRIVER_JAVA_OPTIONS: f"-Dmine=1 -XX:SharedArchiveFile={archive}",
        "spark.ui.enabled": "false",
    }
    assert own[DRIVER_JAVA_OPTIONS] == "-Dmine=1", "the caller's settings are not changed"
    assert with_archive({}, archive) == {DRIVER_JAVA_OPTIONS: f"-XX:SharedArchiveFile={archive}"}


def test_without_an_archive_file_the_settings_are_left_as_they_are(tmp_path: Path) -> None:
    settings = {DRIVER_JAVA_OPTIONS: "-Dmine=1"}
    assert with_archive(settings, tmp_path / "absent.jsa") == settings
    assert with_archive(settings, None) == settings


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (None, DEFAULT_ARCHIVE),
        ("off", None),
        ("OFF", None),
        ("", None),
        ("/a/b.jsa", Path("/a/b.jsa")),
    ],
)
def test_the_environment_names_the_archive_or_turns_it_off(
    value: str | None, path: Path | None
) -> None:
    environ = {} if value is None else {ARCHIVE_ENV: value}
    assert archive_path(environ) == path


@pytest.fixture
def cut(tmp_path: Path) -> Path:
    """The first megabyte of the installed archive: mapping it crashes the JVM (SIGBUS)."""
    installed = archive_path()
    assert installed is not None and installed.is_file(), "`make install` builds it"
    cut = tmp_path / "cut.jsa"
    with installed.open("rb") as source:
        cut.write_bytes(source.read(1_000_000))
    return cut


@pytest.mark.spark
def test_an_archive_cut_short_is_refused_before_agents_could_map_it(cut: Path) -> None:
    """``build`` verifies its dump in a session of its own before putting it in place."""
    with pytest.raises(RuntimeError, match=r"a Spark session with .*cut\.jsa failed"):
        verify(cut)


@pytest.mark.spark
@pytest.mark.parametrize("ahead", [False, True], ids=["session", "launched-ahead"])
def test_an_agents_driver_that_cannot_start_with_the_archive_starts_without_it(
    tmp_path: Path, cut: Path, ahead: bool
) -> None:
    """An archive damaged after it was put in place crashes the JVM that maps it: the session
    starts again without it, and the warning says what to do. Launched ahead (as `sparkpoint
    agent` does), the crash is the session's to report and recover from the same way."""
    launch = "from sparkpoint.agent.spark.session import launch_driver\n"
    program = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        + (launch + "launch_driver('local[1]')\n" if ahead else "")
        + "from sparkpoint.agent.spark.session import spark_session\n"
        "session = spark_session('damaged-archive', 'local[1]')\n"
        "print('sum', session.sparkContext.parallelize(range(4)).sum())\n"
    )
    env = dict(os.environ, **{ARCHIVE_ENV: str(cut), "PYTHONPATH": str(ROOT)})

    result = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    assert "sum 6" in result.stdout
    assert f"did not start with the class archive {cut}" in result.stderr
    assert f"{ARCHIVE_ENV}=off" in result.stderr
