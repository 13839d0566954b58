"""The package as a user installs it: the built wheel holds one top-level package, ``sparkpoint``
(with its Avro schemas), and nothing named ``services``; installed into a fresh virtual
environment it imports as ``sparkpoint``, gives the job API from the top, and runs the
``sparkpoint`` command.

The fresh environment gets only the wheel; its dependencies (pyspark alone is 300 MB) come from
this checkout's environment through a path file, which adds that site-packages directory to
``sys.path`` without processing its own path files, so the editable install of the checkout
(services/ on ``sys.path``) does not reach it."""

from __future__ import annotations

import os
import shutil
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


def test_a_users_project_tests_its_job_with_the_plugin_of_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    """tests/user_project, copied out of the repository, runs its own tests with the wheel's
    pytest plugin (found through its ``pytest11`` entry point, nothing configured): the
    harness, a kill and a rescaled resume, live input through a coordinator failover."""
    project = tmp_path / "card-spend"
    shutil.copytree(ROOT / "tests" / "user_project", project)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKPOINT_", "PYTHONPATH"))}
    result = subprocess.run(
        [str(installed / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-v", "-x"],
        capture_output=True, text=True, cwd=project, env=env, timeout=600, check=False,
    )  # fmt: skip
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, output
    assert "3 passed" in result.stdout, output
    assert (
        "plugins:" in result.stdout
        and "sparkpoint" in result.stdout.split("plugins:")[1].splitlines()[0]
    ), output
    plugin = subprocess.run(
        [str(installed / "python"), "-c", "import sparkpoint.testing.plugin as p; print(p.__file__)"],
        capture_output=True, text=True, cwd=project, env=env, timeout=120, check=True,
    )  # fmt: skip
    assert str(installed.parent) in plugin.stdout  # the wheel's plugin, not this checkout's
