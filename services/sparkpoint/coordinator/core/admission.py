"""What the coordinator accepts from agents: registrations, status reports, heartbeats and
acknowledgements, judged before they may touch a running job. Pure logic: no I/O, the time is
an argument.

Everything on ``sparkpoint.jobs`` and ``sparkpoint.acks`` is input from outside the coordinator:
an agent of an older attempt, a second agent started for a job that already runs, a record
written by hand or by a broken client. The rules, in order:

1. **Well-formed**: ids match the job id pattern, numbers lie within their ranges (ids below
   2^53, parallelism within 1..max parallelism, max parallelism within Flink's bounds),
   subtasks are exactly Flink's key-group ranges for their indexes, the configuration parses
   and its directories lie inside the coordinator's storage roots. A malformed registration is
   refused (``INVALID``) and changes nothing.
2. **One agent drives a job** (a lease). The accepted agent (the *holder*) sends a heartbeat
   every `HEARTBEAT_INTERVAL_MS`; while the coordinator has heard from it within
   `LEASE_TIMEOUT_MS`, a registration from any other agent is refused (``LEASE_HELD``). After
   that the holder counts as dead and another agent may take the job over.
3. **Attempts only grow**: a registration for a running job must carry an attempt above the
   holder's (``ATTEMPT`` otherwise): a restart inside an agent counts up, and an agent that
   takes a job over from a dead one starts above it. A job that ended accepts any attempt.
4. **Answers come from the holder**: status changes, heartbeats, acknowledgements and declines
   whose agent or attempt is not the holder's are refused; an acknowledgement's files must lie
   in the checkpoint's own directory or the job's ``shared/`` directory.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointStoreRecord,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
)
from sparkpoint.common.keygroups import UPPER_BOUND_MAX_PARALLELISM, key_group_range
from sparkpoint.common.limits import (
    LEASE_TIMEOUT_MS,
    MAX_ID,
    MAX_TEXT,
    job_id_problem,
)
from sparkpoint.common.metadata import SEGMENT_NAME
from sparkpoint.common.paths import canonical
from sparkpoint.common.settings import CheckpointConfig, ConfigError

AGENT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SUBTASK_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}-(\d{1,5})$")
MAX_OPTIONS = 256
MAX_ATTEMPT = 2**31 - 1
MAX_HANDLES = 100_000
"""State handles in one acknowledgement: a subtask owns at most 32,768 key groups."""


class Refusal(enum.Enum):
    """Why a registration was refused (the agent's next step depends on it)."""

    INVALID = "INVALID"
    """The registration is malformed: nothing to retry."""
    ATTEMPT = "ATTEMPT"
    """The attempt is not above the running job's: register again above the holder's."""
    LEASE_HELD = "LEASE_HELD"
    """Another agent drives the job and is alive."""


@dataclass(frozen=True, slots=True)
class Holder:
    """The agent that drives a job, and when the coordinator last heard from it (its clock)."""

    agent_id: str
    attempt: int
    last_seen_ms: int

    def alive(self, now_ms: int) -> bool:
        return now_ms - self.last_seen_ms < LEASE_TIMEOUT_MS

    def matches(self, agent_id: str | None, attempt: int | None) -> bool:
        return agent_id == self.agent_id and attempt == self.attempt


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one registration."""

    accepted: bool
    duplicate: bool = False
    """The holder's own registration read again (replay, or a lost answer): nothing changes."""
    refusal: Refusal | None = None
    reason: str | None = None

    @classmethod
    def refuse(cls, refusal: Refusal, reason: str) -> Admission:
        return cls(False, refusal=refusal, reason=reason)


ACCEPT = Admission(True)


def registration_problem(
    registration: JobRegistered, key: str | None, in_roots: Callable[[str], bool], roots: str
) -> str | None:
    """What is wrong with a registration, in one sentence; None when it is well-formed.
    ``in_roots`` tells whether a path lies inside the coordinator's storage roots (``roots``,
    for the message)."""
    r = registration
    problem = job_id_problem(r.job_id)
    if problem is not None:
        return problem
    if key != r.job_id:
        return f"the record's key {_short(key)} is not its job id {r.job_id}"
    if len(r.job_name) > MAX_TEXT:
        return f"job name longer than {MAX_TEXT} characters"
    if not AGENT_ID_PATTERN.match(r.agent_id):
        return (
            f"agent id {_short(r.agent_id)} must be letters, digits, '.', '_' or '-' (at most 64)"
        )
    if not 0 <= r.attempt <= MAX_ATTEMPT:
        return f"attempt must be within 0..{MAX_ATTEMPT}, got {r.attempt}"
    if r.status.is_terminal:
        return f"a registration cannot carry the terminal status {r.status.name}"
    if not 0 < r.max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        return f"max parallelism must be within 1..{UPPER_BOUND_MAX_PARALLELISM}, got {r.max_parallelism}"
    if not 0 < r.parallelism <= r.max_parallelism:
        return f"parallelism must be within 1..{r.max_parallelism} (the max parallelism), got {r.parallelism}"
    problem = _subtasks_problem(r)
    if problem is not None:
        return problem
    if r.restored_checkpoint_id is not None and not 0 < r.restored_checkpoint_id <= MAX_ID:
        return f"restored checkpoint id must be within 1..{MAX_ID}, got {r.restored_checkpoint_id}"
    if r.restored_external_path is not None and len(r.restored_external_path) > MAX_TEXT:
        return f"restored path longer than {MAX_TEXT} characters"
    if (
        r.restored_external_path is not None
        and r.configuration.get("execution.state-recovery.claim-mode", "").upper() == "CLAIM"
        and not in_roots(r.restored_external_path)
    ):
        return (
            f"claim mode CLAIM takes ownership of {r.restored_external_path}, which lies outside "
            f"the coordinator's storage roots ({roots}): restore it with NO_CLAIM"
        )
    return _configuration_problem(r.configuration, in_roots, roots)


def _subtasks_problem(r: JobRegistered) -> str | None:
    if not r.subtasks:
        return "the registration lists no subtasks"
    if len(r.subtasks) > 4 * r.parallelism:
        return f"{len(r.subtasks)} subtasks for parallelism {r.parallelism}"
    seen: set[str] = set()
    for subtask in r.subtasks:
        match = SUBTASK_ID_PATTERN.match(subtask.subtask_id)
        if match is None or subtask.subtask_id in seen:
            return f"subtask id {_short(subtask.subtask_id)} is malformed or repeated (expected kind-index, e.g. keyed-0)"
        seen.add(subtask.subtask_id)
        index = int(match.group(1))
        if subtask.index != index or not 0 <= index < r.parallelism:
            return f"subtask {subtask.subtask_id} has index {subtask.index}, not {index} within 0..{r.parallelism - 1}"
        expected = key_group_range(r.max_parallelism, r.parallelism, index)
        if (subtask.key_group_start, subtask.key_group_end) != (expected.start, expected.end):
            return (
                f"subtask {subtask.subtask_id} claims key groups {subtask.key_group_start}..{subtask.key_group_end}; "
                f"index {index} of {r.parallelism} owns {expected.start}..{expected.end} of {r.max_parallelism}"
            )
    return None


def _configuration_problem(
    configuration: dict[str, str], in_roots: Callable[[str], bool], roots: str
) -> str | None:
    if len(configuration) > MAX_OPTIONS:
        return f"{len(configuration)} configuration entries (at most {MAX_OPTIONS})"
    for key, value in configuration.items():
        if len(key) > MAX_TEXT or len(value) > MAX_TEXT:
            return f"configuration entry {_short(key)} is longer than {MAX_TEXT} characters"
    try:
        config = CheckpointConfig.from_options(configuration)
    except ConfigError as exc:
        return f"invalid configuration: {exc}"
    for option, directory in (
        ("execution.checkpointing.dir", config.checkpoint_dir),
        ("execution.checkpointing.savepoint-dir", config.savepoint_dir),
    ):
        if option in configuration and not in_roots(directory):
            return f"{option} {directory} is outside the coordinator's storage roots ({roots})"
    return None


def admit(registration: JobRegistered, holder: Holder | None, now_ms: int) -> Admission:
    """A well-formed registration against the job's current holder (None: the job does not run
    here; it is new, or it ended)."""
    if holder is None:
        return ACCEPT
    if registration.agent_id == holder.agent_id:
        if registration.attempt == holder.attempt:
            return Admission(True, duplicate=True)
        if registration.attempt > holder.attempt:
            return ACCEPT  # the agent restarted the job itself
        return Admission.refuse(
            Refusal.ATTEMPT,
            f"attempt {registration.attempt} of agent {registration.agent_id} is older than its current attempt {holder.attempt}",
        )
    if holder.alive(now_ms):
        return Admission.refuse(
            Refusal.LEASE_HELD,
            f"job {registration.job_id} is driven by agent {holder.agent_id} (attempt {holder.attempt}), "
            f"last heard from {now_ms - holder.last_seen_ms} ms ago",
        )
    if registration.attempt <= holder.attempt:
        return Admission.refuse(
            Refusal.ATTEMPT,
            f"a takeover of job {registration.job_id} must register an attempt above {holder.attempt}, got {registration.attempt}",
        )
    return ACCEPT


def sender_problem(
    holder: Holder | None, agent_id: str | None, attempt: int, what: str
) -> str | None:
    """Status changes, heartbeats, acknowledgements and declines come from the holder only."""
    if holder is None:
        return f"{what} for a job that does not run here"
    if not holder.matches(agent_id, attempt):
        return (
            f"{what} from agent {_short(agent_id)} attempt {attempt}; the job is driven by "
            f"agent {holder.agent_id} attempt {holder.attempt}"
        )
    return None


def ack_problem(
    ack: AcknowledgeCheckpoint, location: str | None, job_dir: str, subtasks: frozenset[str]
) -> str | None:
    """Whether an acknowledgement's values are plausible and its files lie where this
    checkpoint's files may lie: its own directory (``location``; None when the checkpoint is
    unknown) or the job's ``shared/`` directory."""
    if not 0 < ack.checkpoint_id <= MAX_ID:
        return f"checkpoint id {ack.checkpoint_id} out of range"
    if ack.subtask_id not in subtasks:
        return f"unknown subtask {_short(ack.subtask_id)}"
    numbers = (
        ack.state_size_bytes, ack.alignment_duration_ms, ack.sync_duration_ms,
        ack.async_duration_ms, ack.persisted_data_bytes, ack.checkpointed_size_bytes,
        ack.processed_data_bytes,
    )  # fmt: skip
    if min(numbers) < 0 or max(numbers) > MAX_ID:
        return "a size or duration is negative or out of range"
    if len(ack.state_handles) > MAX_HANDLES:
        return f"{len(ack.state_handles)} state handles (at most {MAX_HANDLES})"
    if location is None:
        return f"checkpoint {ack.checkpoint_id} is unknown: its files cannot be checked"
    allowed = places(location, job_dir)
    for handle in ack.state_handles:
        if not 0 <= handle.size_bytes <= MAX_ID:
            return f"state handle {_short(handle.path)} has size {handle.size_bytes}"
        if handle.offset is not None and not (
            0 <= handle.offset <= MAX_ID and SEGMENT_NAME.fullmatch(handle.segment or "")
        ):
            return f"state handle {_short(handle.path)}: a segment needs an offset >= 0 and a plain file name"
        path = handle.path
        if not path.startswith(allowed) or canonical(path) != path:
            return f"state handle {_short(path)} lies outside {location} and {job_dir}/shared (or is not an absolute path in canonical form)"
    return None


@functools.lru_cache(maxsize=4096)
def places(location: str, job_dir: str) -> tuple[str, str]:
    """The prefixes a checkpoint's files may have: its own directory and the job's shared/."""
    return canonical(location).rstrip("/") + "/", canonical(f"{job_dir}/shared") + "/"


@dataclass(frozen=True, slots=True)
class Adoption:
    """What a new owner of a partition takes over for one job after replaying its history."""

    registration: JobRegistered
    status: JobStatus
    """RUNNING, or the terminal status the job reached."""


def adopt(
    history: Sequence[JobRegistered | JobStatusChanged], store: CheckpointStoreRecord | None
) -> Adoption | None:
    """The registration the previous owner accepted, and whether that job has ended, from the
    job's well-formed records in partition order and its store record.

    The store record names the agent and attempt that were accepted (written in the same
    transaction as the acceptance), so registrations the previous owner refused are not taken
    over by mistake. Without such a record (a job never accepted under these rules), the newest
    registration is taken."""
    registrations = [(i, e) for i, e in enumerate(history) if isinstance(e, JobRegistered)]
    if not registrations:
        return None
    chosen = registrations[-1]
    if store is not None and store.agent_id is not None:
        held = [
            (i, e)
            for i, e in registrations
            if (e.agent_id, e.attempt) == (store.agent_id, store.attempt)
        ]
        if held:
            chosen = held[-1]
    index, registration = chosen
    status = JobStatus.RUNNING
    for event in history[index + 1 :]:
        if (
            isinstance(event, JobStatusChanged)
            and event.status.is_terminal
            and (event.agent_id, event.attempt) == (registration.agent_id, registration.attempt)
        ):
            status = event.status
    if (
        store is not None
        and store.job_status is not None
        and store.job_status in JobStatus.__members__
        and JobStatus[store.job_status].is_terminal
        and (store.agent_id, store.attempt) == (registration.agent_id, registration.attempt)
    ):
        status = JobStatus[store.job_status]
    return Adoption(registration, status)


def _short(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "(none)"
    return repr(text if len(text) <= limit else text[:limit] + "...")
