"""Flink JobIDs of sparkpoint jobs: derived from the job id alone, 32 lower-case hex digits, and
naming the partition (so the coordinator instance) that owns the job."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkpoint.common.flink_ids import candidate_partitions, flink_job_id, is_flink_id
from sparkpoint.common.kafka import partition_of

pytestmark = pytest.mark.unit

job_ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=80)


@given(job_ids)
def test_a_job_id_has_one_flink_job_id_of_32_lower_case_hex_digits(job_id: str) -> None:
    jid = flink_job_id(job_id)
    assert is_flink_id(jid) and jid == jid.lower()
    assert flink_job_id(job_id) == jid


@given(job_ids, st.integers(min_value=1, max_value=500))
def test_the_flink_job_id_names_the_partition_of_the_job_first(
    job_id: str, partitions: int
) -> None:
    assert candidate_partitions(flink_job_id(job_id), partitions)[0] == partition_of(
        job_id, partitions
    )


def test_a_job_id_of_32_hex_digits_is_its_own_and_routes_as_itself() -> None:
    job_id = "0123456789ABCDEF0123456789abcdef"
    assert flink_job_id(job_id) == job_id.lower()
    assert partition_of(job_id, 12) in candidate_partitions(job_id, 12)  # as written


def test_different_job_ids_get_different_flink_job_ids() -> None:
    ids = {flink_job_id(f"job-{i}") for i in range(10_000)}
    assert len(ids) == 10_000


@pytest.mark.parametrize(
    "text", ["", "payments-example", "f" * 31, "f" * 33, "g" * 32, " " + "f" * 31]
)
def test_what_is_not_a_flink_job_id(text: str) -> None:
    assert not is_flink_id(text)
