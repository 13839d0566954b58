"""sparkpoint.testing's pure parts: `assert_exactly_once` names missing, duplicated and unexpected
rows with examples; faults are checked by name; a job run by ``run_job`` gets topics and a name
of its own and travels to the agent by value; the coordinator fixture falls back to a process
where Docker does not answer, and the container's command is the coordinator's. (The fixtures
themselves run in tests/e2e/test_wheel.py, from a user's project.)"""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint.agent.example import example_job
from sparkpoint.agent.job import FileSink, KafkaSink, KafkaSource
from sparkpoint.testing import (
    ExactlyOnceViolation,
    assert_exactly_once,
    kill_agent,
    kill_coordinator,
)
from sparkpoint.testing.cluster import (
    COORDINATOR,
    CoordinatorProcess,
    Fault,
    input_by_topic,
    pickled_job,
    unique,
)
from sparkpoint.testing.containers import SparkpointContainer, coordinator_for_tests
from sparkpoint.testing.exactly_once import compare
from tests.agent_jobs import WindowCounts

REFERENCE = [{"card": "a", "spent": 1}, {"card": "a", "spent": 3}, {"card": "b", "spent": 2}]


def test_the_same_rows_in_any_order_and_with_more_columns_pass() -> None:
    output = pd.DataFrame(REFERENCE[::-1]).assign(offset=[7, 8, 9])
    assert_exactly_once(output, REFERENCE)
    assert_exactly_once([], [])


def test_missing_duplicated_and_unexpected_rows_are_counted_with_examples() -> None:
    output = pd.DataFrame(
        [{"card": "a", "spent": 1}] * 3 + [{"card": "b", "spent": 2}, {"card": "z", "spent": 9}]
    )
    with pytest.raises(ExactlyOnceViolation) as raised:
        assert_exactly_once(output, REFERENCE)
    error = raised.value
    assert sum(error.missing.values()) == 1 and ("a", 3) in error.missing
    assert error.duplicated == {("a", 1): 2}
    assert error.unexpected == {("z", 9): 1}
    text = str(error)
    assert "5 rows, expected 3" in text
    assert "1 missing" in text and "{'card': 'a', 'spent': 3}" in text
    assert "2 duplicated" in text and "x2" in text
    assert "1 unexpected" in text and "'z'" in text


def test_a_large_difference_shows_a_few_examples_not_a_dump() -> None:
    reference = [{"n": i} for i in range(10_000)]
    with pytest.raises(ExactlyOnceViolation) as raised:
        assert_exactly_once(reference[:5_000], reference)
    assert "5000 missing" in str(raised.value)
    assert len(str(raised.value)) < 400


def test_numpy_and_python_values_compare_equal_and_columns_choose_what_counts() -> None:
    output = pd.DataFrame({"card": ["a"], "spent": pd.Series([3], dtype="int64"), "at": [1.5]})
    assert compare(output, [{"card": "a", "spent": 3}]).exact
    assert_exactly_once(output, [("a", 3)], columns=["card", "spent"])
    with pytest.raises(KeyError, match="not in the rows"):
        assert_exactly_once(output, [{"card": "a", "total": 3}])


def test_faults_are_named_points_or_the_coordinator() -> None:
    assert kill_agent("after-ack", 2, resume_with=4) == Fault("after-ack", 2, 4)
    assert kill_coordinator(3).point == COORDINATOR
    with pytest.raises(ValueError, match="unknown fault point 'after-everything'"):
        kill_agent("after-everything")
    with pytest.raises(ValueError, match="at least 1"):
        kill_agent("mid-publish", 0)


def test_a_run_renames_the_jobs_topics_and_travels_by_value(tmp_path: Path) -> None:
    job = example_job("payments-stats", "payments", "stats", bounded=True)
    job = type(job)(**{**vars(job), "sink": KafkaSink("stats", side_outputs={"late": "late"})})
    renamed_job, renamed = unique(job, "t1", tmp_path)
    assert renamed == {"payments": "payments-t1", "stats": "stats-t1", "late": "late-t1"}
    assert isinstance(renamed_job.source, KafkaSource)
    assert renamed_job.source.topics == ["payments-t1"] and renamed_job.id == "payments-stats-t1"
    files, _ = unique(type(job)(**{**vars(job), "sink": FileSink("/data/out")}), "t2", tmp_path)
    assert isinstance(files.sink, FileSink) and files.sink.directory == str(tmp_path / "output")

    assert list(input_by_topic(renamed_job, [{"id": 1}], renamed)) == ["payments-t1"]
    with pytest.raises(ValueError, match="does not read"):
        input_by_topic(renamed_job, {"other": []}, renamed)

    windows = type(job)(**{**vars(renamed_job), "function": WindowCounts()})
    spec = pickled_job(windows, tmp_path)
    loaded = pickle.loads((tmp_path / "job.pkl").read_bytes())
    assert spec == f"{tmp_path / 'job.py'}:job"
    assert type(loaded.function).__name__ == "WindowCounts" and loaded.id == windows.id


def test_without_docker_the_coordinator_is_a_process_and_the_containers_command_is_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKPOINT_TEST_CONTAINERS", "1")
    monkeypatch.setattr("sparkpoint.testing.containers.docker_answers", lambda: False)
    chosen = coordinator_for_tests("127.0.0.1:9092", tmp_path)
    assert type(chosen) is CoordinatorProcess
    monkeypatch.setattr("sparkpoint.testing.containers.docker_answers", lambda: True)
    container = coordinator_for_tests("127.0.0.1:9092", tmp_path)
    assert isinstance(container, SparkpointContainer) and container.image == "sparkpoint:test"
    command = container.command()
    assert command[:2] == ["sparkpoint", "coordinator"]
    assert command[command.index("--rest-port") + 1] == str(container.port)
    assert command[command.index("--config") + 1] == str(tmp_path / "coordinator.yaml")


def test_live_input_needs_an_unbounded_source(tmp_path: Path) -> None:
    from sparkpoint.testing.cluster import JobRunner, Kafka

    runner = JobRunner(
        Kafka("127.0.0.1:1", "embedded"), CoordinatorProcess("127.0.0.1:1", tmp_path), tmp_path
    )
    bounded = example_job("live", "payments", "stats", bounded=True)
    with pytest.raises(ValueError, match="bounded"):
        runner.run(bounded, [{"id": 1}], rate=100)
