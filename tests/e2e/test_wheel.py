"""The package as a user installs it: the built wheel holds one top-level package, ``sparkpoint``
(with its Avro schemas), and nothing named ``services``; installed into a fresh virtual
environment it imports as ``sparkpoint``, gives the job API from the top, and runs the
``sparkpoint`` command.

The fresh environment gets only the wheel; its dependencies (pyspark alone is 300 MB) come from
this checkout's environment through a path file, which adds that site-packages directory to
``sys.path`` without processing its own path files, so the editable install of the checkout
(services/ on ``sys.path``) does not reach it."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("sparkpoint-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the wheel installed; its ``bin`` directory."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    before = set(Path(purelib).iterdir())
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    added = {p.name for p in set(Path(purelib).iterdir()) - before}
    assert added == {"sparkpoint", wheel.name.split("-py3")[0] + ".dist-info"}, added
    yield home / "bin"


def test_the_wheel_holds_one_top_level_package_sparkpoint_with_its_schemas(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "sparkpoint",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    assert "sparkpoint/schemas/AgentHeartbeat.avsc" in names
    assert "sparkpoint/agent/spark/spark_pools.xml" in names


def test_installed_it_adds_only_sparkpoint_and_imports_with_the_job_api(
    installed: Path, tmp_path: Path
) -> None:
    check = (
        "import sparkpoint\n"
        "from sparkpoint import Job, KafkaSource, KafkaSink, KeyedFunction, ValueState\n"
        "from sparkpoint.common.avro import EventCodec\n"
        "assert EventCodec().catalogue.names()\n"
        "print(sparkpoint.__file__)\n"
    )
    result = subprocess.run(
        [str(installed / "python"), "-c", check],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert str(installed.parent) in result.stdout  # the wheel's, not this checkout's


def test_installed_the_sparkpoint_command_runs(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed / "sparkpoint"), "--help"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage: sparkpoint" in result.stdout and "coordinator" in result.stdout
