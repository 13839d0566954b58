"""How an agent runs its job: the command line's options (`AgentOptions`), the job's settings
resolved under Flink's current names (`JobSettings`), and where the agent keeps its files
(`Places`): its working state and staged output under the job's task-owned storage, its
channels on local disk (a local master) or where every executor reaches them."""

from __future__ import annotations

import posixpath
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sparkpoint.agent.job import Job
from sparkpoint.agent.rounds.channels import DEFAULT_CAPACITY_BYTES
from sparkpoint.agent.state.backend import job_dirs
from sparkpoint.common.options import in_families, normalise, without_effect
from sparkpoint.common.redaction import secrets_of
from sparkpoint.common.restarts import RestartConfig
from sparkpoint.common.settings import CheckpointConfig, ConfigError, RecoveryConfig
from sparkpoint.common.storage import absolute

MAX_ROWS_PER_ROUND = 250_000
"""Rows a stage-2 task takes from its channel per round: bounds a round's latency and memory."""


@dataclass
class AgentOptions:
    bootstrap: str
    parallelism: int | None = None
    restore: str | None = None
    """A checkpoint or savepoint directory, or ``latest``."""
    allow_non_restored_state: bool = False
    master: str = "local[*]"
    spark_settings: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    channel_dir: str | None = None
    """Where stage-1 tasks write segments (a path or URL every executor reaches; each run uses
    a directory of its own under it, removed at its end); default: the agent's local disk on a
    local master, the job's task-owned storage otherwise."""
    max_rows_per_round: int = MAX_ROWS_PER_ROUND
    allow_fresh_start: bool = False
    """With ``restore="latest"``: start from the beginning when the job's checkpoints were
    discarded at its end, instead of refusing to."""
    claim_mode: str | None = None
    """``execution.state-recovery.claim-mode`` over the job's (CLAIM or NO_CLAIM)."""
    resident_tasks: bool | None = None
    """Run the job's tasks in resident Spark tasks on a local master (`spark.resident`); None:
    when the agent starts the session itself, unless ``spark.sparkpoint.residentTasks`` is
    false; a session handed in keeps a Spark job per round unless this is True."""


@dataclass(frozen=True)
class JobSettings:
    settings: dict[str, str]
    """What the job registers: its options under Flink's current names, with the agent's
    defaults and overrides (``dir`` absolute, ``incremental``, the claim mode)."""
    config: CheckpointConfig
    recovery: RecoveryConfig
    restarts: RestartConfig
    no_effect: list[str]
    """Options the job sets that have no effect here: listed once at start."""

    @classmethod
    def of(cls, job: Job, options: AgentOptions) -> JobSettings:
        # Flink's current names (older ones resolved), so that defaults below never shadow them
        settings = {k: v for k, v in job.settings.items() if not in_families(k)}
        settings |= {k: str(v) for k, v in normalise(job.settings).items()}
        settings.setdefault("execution.checkpointing.incremental", "true")
        if options.claim_mode:
            settings["execution.state-recovery.claim-mode"] = options.claim_mode
        if options.checkpoint_dir:
            settings["execution.checkpointing.dir"] = options.checkpoint_dir
        settings.setdefault("execution.checkpointing.dir", CheckpointConfig().checkpoint_dir)
        for key in ("execution.checkpointing.dir", "execution.checkpointing.savepoint-dir"):
            if key in settings:  # relative directories mean this process's working directory
                settings[key] = absolute(settings[key])
        config = CheckpointConfig.from_options(settings, CheckpointConfig())
        check_during_recovery(config)
        return cls(
            settings, config, RecoveryConfig.from_options(settings),
            RestartConfig.from_options(settings), without_effect(settings),
        )  # fmt: skip


@dataclass(frozen=True)
class Places:
    """Where the agent keeps its files. Its working state and staged output belong to this
    agent only: another agent of the job (one that died, or one refused while this one runs)
    never shares a file with it."""

    agent_id: str
    checkpoint_dir: str
    shared_dir: str
    taskowned_dir: str
    run_dir: str
    work_dir: Path
    channel_dir: str
    """Segments live here, written by stage-1 tasks, read by stage-2 tasks: never by the driver
    (on a cluster, storage every executor reaches)."""

    @classmethod
    def of(cls, job_id: str, checkpoint_dir: str, options: AgentOptions, work_dir: Path) -> Places:
        agent_id = f"agent-{uuid.uuid4().hex[:8]}"
        shared, taskowned = job_dirs(checkpoint_dir, job_id)
        run_dir = f"{taskowned}/{agent_id}"
        if options.channel_dir:
            channels = f"{options.channel_dir.rstrip('/')}/{job_id}-{agent_id}"
        elif options.master.startswith("local"):
            channels = str(work_dir / "channels")
        else:
            channels = f"{run_dir}/channels"
        return cls(agent_id, checkpoint_dir, shared, taskowned, run_dir, work_dir, channels)

    @property
    def state_dir(self) -> str:
        return f"{self.run_dir}/state"

    @property
    def sink_dir(self) -> str:
        return f"{self.run_dir}/sink"

    @property
    def run_name(self) -> str:
        return posixpath.basename(self.run_dir)


def check_during_recovery(config: CheckpointConfig) -> None:
    """Checkpoints during recovery need unaligned checkpoints and restored output on the
    downstream side (FLIP-547): refused at start otherwise."""
    if config.unaligned_during_recovery and not (
        config.unaligned and config.unaligned_recover_output_on_downstream
    ):
        missing = [
            f"execution.checkpointing.{name}: true"
            for name, value in (
                ("unaligned.enabled", config.unaligned),
                (
                    "unaligned.recover-output-on-downstream.enabled",
                    config.unaligned_recover_output_on_downstream,
                ),
            )
            if not value
        ]
        raise ConfigError(
            "execution.checkpointing.unaligned.during-recovery.enabled",
            f"checkpoints during recovery need {' and '.join(missing)}",
        )


def job_secrets(job: Job) -> list[str]:
    """The secret values a job's definition holds (its settings, its Kafka source's and sink's
    client properties, their Schema Registry settings): registered for redaction when the agent
    starts, so no log line of the driver shows them (the tasks' logs are Spark's)."""
    found = secrets_of(job.settings)
    for part in (job.source, job.sink):
        found += secrets_of(getattr(part, "properties", {}))
        found += secrets_of(getattr(getattr(part, "value_format", None), "registry_properties", {}))
    return found
