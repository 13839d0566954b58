"""The `sparkpoint` command, run as a user runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sparkpoint.common.broker import free_port, wait_for_metadata
from sparkpoint.common.events import EVENT_TYPES
from tests.conftest import KafkaUnderTest

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def sparkpoint(
    *args: str, prefix: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    if prefix is not None:
        env["SPARKPOINT_TOPIC_PREFIX"] = prefix
    return subprocess.run(
        [SPARKPOINT, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_demo_prints_broker_topics_and_a_round_trip_of_every_event_type() -> None:
    result = sparkpoint("demo", "--exchange", "--once")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^broker: 127\.0\.0\.1:\d+ \(embedded tansu", out, re.M)
    for suffix, policy in [
        ("jobs", "compact"),
        ("control", "delete"),
        ("checkpoint-store", "compact"),
    ]:
        assert re.search(rf"sparkpoint\.{suffix}\s+cleanup\.policy={policy}", out)
    printed = set(re.findall(r"@\d+\s+(\w+)\s", out))
    assert printed == {cls.__name__ for cls in EVENT_TYPES}


@pytest.mark.spark
def test_the_demo_runs_until_checkpoints_complete_and_processed_output_is_committed(
    tmp_path: Path,
) -> None:
    port = free_port()
    result = subprocess.run(
        [SPARKPOINT, "demo", "--once", "--rest-port", str(port)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False,
        env={k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"},
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"coordinator: http://127.0.0.1:{port}" in out
    completed = re.findall(r"checkpoint (\d+) COMPLETED .* 4/4 subtasks, (\S+)", out)
    assert len(completed) >= 3, out
    read = [
        int(n.replace(",", "")) for n in re.findall(r"([\d,]+) records read since the last", out)
    ]
    assert len(read) >= 3 and sum(read) > 0, out  # records were processed, not only checkpoints
    committed = re.search(r"^output committed: (\d+) records in payment-stats$", out, re.M)
    assert committed and int(committed.group(1)) > 0, out
    assert out.rstrip().endswith("stopping")
    for name in ("coordinator", "generator", "agent"):
        assert (tmp_path / ".sparkpoint" / "demo" / f"{name}.log").is_file()


def test_topics_create_is_idempotent(kafka: KafkaUnderTest) -> None:
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    first = sparkpoint(
        "topics", "create", "--bootstrap", kafka.bootstrap, "--partitions", "2", prefix=prefix
    )
    second = sparkpoint("topics", "create", "--bootstrap", kafka.bootstrap, prefix=prefix)

    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.count(" created") == 9
    assert second.stdout.count(" exists") == 9
    assert f"{prefix}checkpoint-overrides" in second.stdout
    assert "partitions=2" in second.stdout


def test_broker_command_runs_in_the_foreground_until_terminated() -> None:
    port = free_port()
    process = subprocess.Popen(
        [SPARKPOINT, "broker", "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for_metadata(f"127.0.0.1:{port}", 15)
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def test_bad_usage_exits_2() -> None:
    result = sparkpoint("topics", "create", "--partitions", "zero")

    assert result.returncode == 2
    assert "--partitions" in result.stderr


def test_a_coordinator_with_no_transaction_in_flight_is_refused() -> None:
    result = sparkpoint("coordinator", "--transactions-in-flight", "0", timeout=30)

    assert result.returncode == 2
    assert "--transactions-in-flight" in result.stderr


@pytest.mark.parametrize("command", ["coordinator", "demo"])
def test_a_flink_web_ui_that_holds_no_dashboard_is_refused_before_anything_starts(
    command: str, tmp_path: Path
) -> None:
    (tmp_path / "not-a-jar.jar").write_text("nothing")
    for given in (tmp_path / "missing.jar", tmp_path / "not-a-jar.jar", tmp_path):
        result = sparkpoint(command, "--flink-web-ui", str(given), timeout=30)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.startswith("sparkpoint: --flink-web-ui: "), result.stderr


def test_an_unreachable_broker_is_one_clear_line_and_exit_1() -> None:
    result = sparkpoint("topics", "create", "--bootstrap", f"127.0.0.1:{free_port()}")

    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "cannot reach Kafka at 127.0.0.1:" in result.stderr


@pytest.mark.parametrize("command", ["coordinator", "agent"])
def test_without_the_topics_coordinator_and_agent_say_how_to_create_them(
    kafka: KafkaUnderTest, command: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    args = ["example"] if command == "agent" else []
    result = sparkpoint(command, *args, "--bootstrap", kafka.bootstrap, prefix=prefix)

    assert result.returncode == 1, result.stderr[-2000:]
    assert f"lacks the sparkpoint topics {prefix}" in result.stderr
    assert f"sparkpoint topics create --bootstrap {kafka.bootstrap}" in result.stderr


@pytest.mark.parametrize(
    ("job", "said", "spark_started"),
    [
        ("no_such_module:job", "No module named 'no_such_module'", False),
        ("no/such/file.py:job", "job file no/such/file.py does not exist", False),
        ("sparkpoint.agent.example:no_such_job", "no attribute 'no_such_job'", True),
    ],
    ids=["module", "file", "attribute"],
)
def test_an_agent_whose_job_cannot_be_loaded_says_why_and_leaves_no_jvm_behind(
    kafka: KafkaUnderTest, job: str, said: str, spark_started: bool
) -> None:
    """`sparkpoint agent` starts the driver's JVM while it loads the job: a job file or module
    that is not there fails before that, and a job that fails to load once it started ends the
    JVM before the command says why (it would otherwise outlive it, writing its start-up lines
    after the error)."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    assert (
        sparkpoint("topics", "create", "--bootstrap", kafka.bootstrap, prefix=prefix).returncode
        == 0
    )
    marker = f"spark.sparkpoint.test={uuid.uuid4().hex}"

    result = sparkpoint(
        "agent", job, "--bootstrap", kafka.bootstrap, "--conf", marker, prefix=prefix
    )

    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cannot load job {job!r}" in result.stderr and said in result.stderr
    if not spark_started:
        assert "Using Spark" not in result.stderr and "log level" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"sparkpoint: cannot load job {job!r}"), "output after the error"
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", "a JVM of the failed command is still running"


def test_an_agent_whose_source_topic_is_missing_says_so_in_a_line(kafka: KafkaUnderTest) -> None:
    """The example job before `sparkpoint generate` created its input: one line naming the
    topic and what to do, no traceback, exit 1."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    assert (
        sparkpoint("topics", "create", "--bootstrap", kafka.bootstrap, prefix=prefix).returncode
        == 0
    )

    result = sparkpoint("agent", "example", "--bootstrap", kafka.bootstrap, prefix=prefix)

    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"sparkpoint: source topic \S*payments does not exist \(create it first\)", last
    )


@pytest.mark.parametrize("argv", [["--help"], ["topics", "--help"], ["demo", "--help"]])
def test_help_is_available(argv: list[str]) -> None:
    result = sparkpoint(*argv)
    assert result.returncode == 0
    assert "usage: sparkpoint" in result.stdout
