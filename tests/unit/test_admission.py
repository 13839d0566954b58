"""What the coordinator accepts from agents (services/sparkpoint/coordinator/core/admission.py): registrations
judged for form, the one-agent lease, growing attempts, the adoption of a replayed history, and
acknowledgements whose files must lie in the checkpoint's own places."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sparkpoint.common.events import (
    CheckpointStoreRecord,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    StateHandle,
    StateHandleKind,
    Subtask,
)
from sparkpoint.common.limits import LEASE_TIMEOUT_MS
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.coordinator.core.admission import (
    Holder,
    Refusal,
    ack_problem,
    admit,
    adopt,
    registration_problem,
    sender_problem,
)
from tests import factories

ROOT = "/data/checkpoints"
T = 5_000_000


def inside_root(path: str) -> bool:
    return path.startswith(ROOT + "/") or path == ROOT


def problem(registration: JobRegistered, key: str | None = None) -> str | None:
    return registration_problem(
        registration, key if key is not None else registration.job_id, inside_root, ROOT
    )


def registration(**changes: object) -> JobRegistered:
    return replace(factories.job_registered(), **changes)  # type: ignore[arg-type]


def test_a_well_formed_registration_passes() -> None:
    assert problem(registration()) is None
    assert problem(factories.job_registered(parallelism=3, max_parallelism=128)) is None


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"job_id": "../../etc"}, "job id"),
        ({"job_id": "x" * 5000}, "job id"),
        ({"job_id": ""}, "job id"),
        ({"agent_id": ""}, "agent id"),
        ({"agent_id": "a" * 500}, "agent id"),
        ({"attempt": -1}, "attempt"),
        ({"parallelism": 0}, "parallelism"),
        ({"parallelism": 10**9}, "parallelism"),
        ({"max_parallelism": 0}, "max parallelism"),
        ({"max_parallelism": 40_000}, "max parallelism"),
        ({"subtasks": []}, "no subtasks"),
        ({"status": JobStatus.FINISHED}, "terminal"),
        ({"job_name": "n" * 100_000}, "job name"),
        ({"restored_checkpoint_id": 2**62}, "restored checkpoint id"),
        ({"restored_checkpoint_id": -4}, "restored checkpoint id"),
        ({"configuration": {"execution.checkpointing.interval": "soon"}}, "invalid configuration"),
        ({"configuration": {"execution.checkpointing.dir": "/etc"}}, "outside the coordinator's storage roots"),
        ({"configuration": {f"k{i}": "v" for i in range(300)}}, "configuration entries"),
    ],
)  # fmt: skip
def test_a_malformed_registration_is_refused_naming_what_is_wrong(
    changes: dict[str, object], expected: str
) -> None:
    found = problem(registration(**changes))
    assert found is not None and expected in found, found


def test_the_record_key_must_be_the_job_id() -> None:
    found = problem(registration(), key="another-job")
    assert found is not None and "key" in found


def test_subtasks_must_be_flinks_key_group_ranges() -> None:
    subtasks = [Subtask("keyed-0", 0, 0, 70), Subtask("keyed-1", 1, 71, 127)]
    found = problem(registration(subtasks=subtasks))
    assert found is not None and "owns 0..63" in found
    repeated = [Subtask("keyed-0", 0, 0, 63), Subtask("keyed-0", 0, 0, 63)]
    assert problem(registration(subtasks=repeated)) is not None
    beyond = [Subtask("keyed-0", 0, 0, 63), Subtask("keyed-2", 2, 64, 127)]
    assert problem(registration(subtasks=beyond)) is not None


def test_a_checkpoint_dir_inside_the_roots_passes() -> None:
    inside = {"execution.checkpointing.dir": f"{ROOT}/team-a"}
    assert problem(registration(configuration=inside)) is None


# --- the lease: one agent drives a job ------------------------------------------------------------


def holder(agent: str = "agent-a", attempt: int = 2, seen_ms_ago: int = 500) -> Holder:
    return Holder(agent, attempt, T - seen_ms_ago)


def test_a_job_that_does_not_run_accepts_any_registration() -> None:
    assert admit(registration(attempt=0), None, T).accepted


def test_the_holder_restarting_itself_is_accepted_with_a_higher_attempt() -> None:
    assert admit(registration(agent_id="agent-a", attempt=3), holder(), T).accepted


def test_the_holder_s_own_registration_read_again_is_a_duplicate() -> None:
    admission = admit(registration(agent_id="agent-a", attempt=2), holder(), T)
    assert admission.accepted and admission.duplicate


def test_an_older_attempt_of_the_holder_is_refused() -> None:
    admission = admit(registration(agent_id="agent-a", attempt=1), holder(), T)
    assert admission.refusal is Refusal.ATTEMPT


def test_a_second_agent_is_refused_while_the_holder_is_alive() -> None:
    admission = admit(registration(agent_id="agent-b", attempt=9), holder(seen_ms_ago=400), T)
    assert not admission.accepted
    assert admission.refusal is Refusal.LEASE_HELD
    assert admission.reason is not None and "agent-a" in admission.reason


def test_another_agent_takes_over_once_the_lease_expired_with_a_higher_attempt() -> None:
    dead = holder(seen_ms_ago=LEASE_TIMEOUT_MS)
    assert admit(registration(agent_id="agent-b", attempt=3), dead, T).accepted
    refused = admit(registration(agent_id="agent-b", attempt=2), dead, T)
    assert refused.refusal is Refusal.ATTEMPT


def test_answers_come_from_the_holder_only() -> None:
    assert sender_problem(holder(), "agent-a", 2, "ack") is None
    assert sender_problem(holder(), "agent-a", 1, "ack") is not None
    assert sender_problem(holder(), "agent-b", 2, "ack") is not None
    assert sender_problem(holder(), None, 2, "ack") is not None
    assert sender_problem(None, "agent-a", 2, "ack") is not None


# --- adopting a replayed history ----------------------------------------------------------------------


def store(
    agent: str | None, attempt: int | None, status: str | None = "RUNNING"
) -> CheckpointStoreRecord:
    return CheckpointStoreRecord(
        factories.JOB, 1, 9, [], T, agent_id=agent, attempt=attempt, job_status=status
    )


def status(agent: str, attempt: int, value: JobStatus) -> JobStatusChanged:
    return JobStatusChanged(factories.JOB, agent, attempt, value, T)


def test_adoption_takes_the_registration_the_store_accepted_not_a_later_refused_one() -> None:
    accepted = registration(agent_id="agent-a", attempt=1)
    refused = registration(agent_id="agent-b", attempt=5)
    adoption = adopt([accepted, refused], store("agent-a", 1))
    assert adoption is not None and adoption.registration is accepted
    assert adoption.status is JobStatus.RUNNING


def test_adoption_without_a_store_holder_takes_the_newest_registration() -> None:
    first, second = registration(attempt=0), registration(attempt=1)
    adoption = adopt([first, second], None)
    assert adoption is not None and adoption.registration is second


def test_adoption_sees_the_holder_s_end_but_not_an_impostor_s() -> None:
    accepted = registration(agent_id="agent-a", attempt=1)
    ended = adopt([accepted, status("agent-a", 1, JobStatus.FINISHED)], store("agent-a", 1))
    assert ended is not None and ended.status is JobStatus.FINISHED
    forged = adopt([accepted, status("agent-x", 1, JobStatus.CANCELED)], store("agent-a", 1))
    assert forged is not None and forged.status is JobStatus.RUNNING


def test_adoption_trusts_the_store_s_terminal_status_of_its_holder() -> None:
    accepted = registration(agent_id="agent-a", attempt=1)
    adoption = adopt([accepted], store("agent-a", 1, "CANCELED"))
    assert adoption is not None and adoption.status is JobStatus.CANCELED


def test_nothing_to_adopt_without_a_registration() -> None:
    assert adopt([status("agent-a", 1, JobStatus.RUNNING)], None) is None


# --- acknowledgements: plausible values, files in the checkpoint's own places ------------------------

JOB_DIR = f"{ROOT}/{factories.JOB}"
LOCATION = f"{JOB_DIR}/chk-7"
SUBTASKS = frozenset({"keyed-0", "keyed-1"})


def ack_with(*paths: str, **changes: object) -> object:
    handles = [StateHandle(p, StateHandleKind.KEYED_STATE, 10) for p in paths]
    return replace(factories.acknowledge(), state_handles=handles, **changes)  # type: ignore[arg-type]


def ack_problem_of(ack: object, location: str | None = LOCATION) -> str | None:
    return ack_problem(ack, location, JOB_DIR, SUBTASKS)  # type: ignore[arg-type]


def test_files_in_the_checkpoint_directory_or_shared_pass() -> None:
    assert (
        ack_problem_of(ack_with(f"{LOCATION}/source-0.json", f"{JOB_DIR}/shared/kg-1.arrow"))
        is None
    )


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        f"{ROOT}/another-job/shared/kg-1.arrow",
        f"{JOB_DIR}/chk-6/source-0.json",
        f"{JOB_DIR}/shared/../../another-job/shared/kg-1.arrow",
        f"{JOB_DIR}/taskowned/state/kg-1.arrow",
        f"{JOB_DIR}/shared",
    ],
)
def test_a_file_anywhere_else_refuses_the_acknowledgement(path: str) -> None:
    found = ack_problem_of(ack_with(path))
    assert found is not None and "outside" in found


def test_an_acknowledgement_of_an_unknown_checkpoint_is_refused() -> None:
    assert ack_problem_of(ack_with(f"{LOCATION}/x"), location=None) is not None


@pytest.mark.parametrize(
    "changes",
    [
        {"checkpoint_id": 0},
        {"checkpoint_id": 2**62},
        {"state_size_bytes": -1},
        {"async_duration_ms": -5},
        {"subtask_id": "keyed-9"},
    ],
)
def test_implausible_values_refuse_the_acknowledgement(changes: dict[str, object]) -> None:
    assert ack_problem_of(ack_with(f"{LOCATION}/x", **changes)) is not None


@pytest.mark.parametrize(
    ("offset", "segment", "refused"),
    [
        (0, "run-00000-00063-000000000001-l0-ab.arrow", False),
        (4096, "base-00005-000000000301-cd.arrow", False),
        (-1, "run-1.arrow", True),
        (0, None, True),
        (0, "../../elsewhere.arrow", True),
        (0, "a#0+1/b.arrow", True),
    ],
)
def test_a_segment_of_a_merged_file_needs_an_offset_and_a_plain_file_name(
    offset: int, segment: str | None, refused: bool
) -> None:
    """File merging: a handle of a segment names the merged file (in shared/), where the
    segment starts and the state file it holds; the same rule holds for a ``_metadata``."""
    handle = StateHandle(
        f"{JOB_DIR}/shared/merged-1.arrows", StateHandleKind.KEYED_STATE, 10, 0, 7, True,
        offset, segment,
    )  # fmt: skip
    ack = replace(factories.acknowledge(), state_handles=[handle])
    assert (ack_problem_of(ack) is not None) == refused
    raw = {
        "subtask_id": "keyed-0",
        "state_handles": [
            {"path": handle.path, "kind": "KEYED_STATE", "size": 10, "shared": True,
             "key_groups": [0, 7], "offset": offset, "segment": segment}
        ],
    }  # fmt: skip
    document = json.dumps({"job_id": "j", "checkpoint_id": 1, "subtasks": [raw]})
    if refused:
        with pytest.raises(BadMetadata, match="segment"):
            SnapshotMetadata.from_json(document, JOB_DIR)
    else:
        read = SnapshotMetadata.from_json(document, JOB_DIR).subtasks[0].handles[0]
        assert (read.path, read.offset, read.segment) == (handle.path, offset, segment)
