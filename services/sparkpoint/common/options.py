"""Every Flink option sparkpoint reads, in one table: its Flink name, type, Flink's default, the
older names Flink still accepts for it, what it sets here (or why it has no effect here), and
its field in ``PATCH /jobs/{id}/checkpoints/configuration`` when it can change at runtime.

Parsing (`normalise`), ``GET /jobs/{id}/config``, the PATCH body, the no-effect warning an agent
prints at start and the option table of docs/settings.md all come from `OPTIONS`
(``python -m sparkpoint.common.options`` prints that table).

The families are Flink 2.x's ``execution.checkpointing.*``, ``execution.state-recovery.*`` and
``restart-strategy.*``, complete as of Flink 2.3, plus sparkpoint's two periodic-savepoint
options (FLIP-10). Any other key in those families is an error that names the closest known key;
keys of other families (``pipeline.*``, ``state.backend.type`` ...) are not read here.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FAMILIES = ("execution.checkpointing.", "execution.state-recovery.", "restart-strategy.")


class Kind(enum.Enum):
    DURATION = "Duration"
    BOOLEAN = "Boolean"
    INTEGER = "Integer"
    LONG = "Long"
    DOUBLE = "Double"
    STRING = "String"
    ENUM = "Enum"
    MEMORY = "MemorySize"


class Section(enum.Enum):
    """Which configuration an option belongs to."""

    CHECKPOINTING = "checkpointing"
    RECOVERY = "recovery"
    RESTART = "restart"


@dataclass(frozen=True)
class Option:
    key: str
    kind: Kind
    default: str
    """As Flink documents it (``10 min``, ``(none)``)."""
    meaning: str
    field: str | None = None
    """The attribute it sets in its section's configuration; None: accepted, no effect here."""
    effect: str = ""
    """How it works here, or why it has no effect."""
    rest: str | None = None
    """Its field in PATCH /jobs/{id}/checkpoints/configuration (FLIP-571 names)."""
    aliases: tuple[str, ...] = ()
    """Older keys Flink still accepts for it."""
    values: tuple[str, ...] = ()
    """An enum's symbols."""
    default_here: str | None = None
    """Where sparkpoint's default differs from Flink's."""

    @property
    def takes_effect(self) -> bool:
        return self.field is not None

    @property
    def section(self) -> Section:
        if self.key.startswith("restart-strategy"):
            return Section.RESTART
        if self.key.startswith("execution.state-recovery."):
            return Section.RECOVERY
        return Section.CHECKPOINTING


C = "execution.checkpointing."
R = "execution.state-recovery."
S = "restart-strategy."
NOT_HERE = "accepted, no effect here"

OPTIONS_LIST: tuple[Option, ...] = (
    # --- when and how checkpoints run --------------------------------------------------------------
    Option(C + "interval", Kind.DURATION, "(none)", "base interval of periodic checkpoints; unset: none", "interval_ms", "coordinator", "checkpointInterval"),
    Option(C + "timeout", Kind.DURATION, "10 min", "how long a checkpoint may take before it expires", "timeout_ms", "coordinator; a change applies to checkpoints in flight", "checkpointTimeout"),
    Option(C + "min-pause", Kind.DURATION, "0 ms", "least time between the end of one checkpoint and the next trigger", "min_pause_ms", "coordinator", "minPauseBetweenCheckpoints"),
    Option(C + "max-concurrent-checkpoints", Kind.INTEGER, "1", "checkpoints in flight at once", "max_concurrent", "coordinator", "maxConcurrentCheckpoints"),
    Option(C + "tolerable-failed-checkpoints", Kind.INTEGER, "0", "consecutive counted checkpoint failures before the job fails over", "tolerable_failed", "coordinator: a failover request restarts the job in its agent", "tolerableCheckpointFailureNumber"),
    Option(C + "mode", Kind.ENUM, "EXACTLY_ONCE", "EXACTLY_ONCE aligns barriers; AT_LEAST_ONCE snapshots without waiting for channels to drain", "mode", "agent", values=("EXACTLY_ONCE", "AT_LEAST_ONCE")),
    Option(C + "externalized-checkpoint-retention", Kind.ENUM, "NO_EXTERNALIZED_CHECKPOINTS", "what happens to retained checkpoints when the job ends", "externalized_retention", "coordinator", values=("DELETE_ON_CANCELLATION", "RETAIN_ON_CANCELLATION", "NO_EXTERNALIZED_CHECKPOINTS")),
    Option(C + "num-retained", Kind.INTEGER, "1", "completed checkpoints kept; older ones are subsumed", "num_retained", "coordinator", aliases=("state.checkpoints.num-retained",)),
    Option(C + "interval-during-backlog", Kind.DURATION, "(none)", "interval while a source reports backlog; 0: no checkpoints during backlog", "interval_during_backlog_ms", "coordinator; the agent reports backlog (the records its sources held at the start, a bounded input) through JobStatusChanged, and its rounds read more meanwhile"),
    Option(C + "checkpoints-after-tasks-finish", Kind.BOOLEAN, "true", "keep checkpointing after some tasks finished", "checkpoints_after_tasks_finish", "reported; sparkpoint's subtasks finish together, at the job's end", aliases=("execution.checkpointing.checkpoints-after-tasks-finish.enabled",)),
    Option(C + "unaligned.enabled", Kind.BOOLEAN, "false", "unaligned checkpoints (needs EXACTLY_ONCE and max-concurrent-checkpoints 1)", "unaligned", "coordinator (sent with each trigger); the agent snapshots in-flight segments as channel state", "unalignedCheckpoints", aliases=("execution.checkpointing.unaligned",)),
    Option(C + "aligned-checkpoint-timeout", Kind.DURATION, "0 ms", "start aligned, switch to unaligned after this long; 0: always unaligned", "aligned_checkpoint_timeout_ms", "coordinator (sent with each trigger)", "alignedCheckpointTimeout", aliases=("execution.checkpointing.alignment-timeout",)),
    Option(C + "unaligned.forced", Kind.BOOLEAN, "false", "force unaligned checkpoints (iterative jobs)", None, NOT_HERE),
    Option(C + "unaligned.interruptible-timers.enabled", Kind.BOOLEAN, "false", "unaligned checkpoints may interrupt firing timers", None, NOT_HERE + ": timers fire inside a round and an unaligned checkpoint never waits for one (the state before it, its records as channel state): always as if on"),
    Option(C + "unaligned.max-subtasks-per-channel-state-file", Kind.INTEGER, "5", "subtasks sharing one channel-state file", None, NOT_HERE),
    Option(C + "unaligned.recover-output-on-downstream.enabled", Kind.BOOLEAN, "false", "restore upstream output buffers on the downstream task (FLIP-547)", "unaligned_recover_output_on_downstream", "agent: channel state always lives downstream here (between stage 1 and stage 2); required by during-recovery.enabled"),
    Option(C + "during-recovery.enabled", Kind.BOOLEAN, "false", "checkpoints while restored channel state is processed (FLIP-547)", "unaligned_during_recovery", "agent: restored files are split by owner first, triggers declined TASK_NOT_READY meanwhile; off, no checkpoint until restored channel state is processed", aliases=("execution.checkpointing.unaligned.during-recovery.enabled",)),
    # --- where and what is written ---------------------------------------------------------------
    Option(C + "dir", Kind.STRING, "(none)", "checkpoint directory (any fsspec URL)", "checkpoint_dir", "agent and coordinator", aliases=("state.checkpoints.dir", "state.backend.fs.checkpointdir"), default_here="./.sparkpoint/checkpoints, made absolute"),
    Option(C + "savepoint-dir", Kind.STRING, "(none)", "default savepoint directory", "savepoint_dir", "coordinator", aliases=("state.savepoints.dir", "savepoints.state.backend.fs.dir"), default_here="./.sparkpoint/savepoints, made absolute"),
    Option(C + "incremental", Kind.BOOLEAN, "false", "copy only key groups changed since the last completed checkpoint", "incremental", "agent", aliases=("state.backend.incremental",), default_here="true (agents register it unless the job says otherwise)"),
    Option(C + "storage", Kind.STRING, "(none)", "checkpoint storage implementation (jobmanager, filesystem)", None, NOT_HERE + ": storage is the fsspec URL of dir", aliases=("state.checkpoint-storage",)),
    Option(C + "create-subdir", Kind.BOOLEAN, "true", "a directory per job id under the checkpoint directory", None, NOT_HERE + ": always <dir>/<job-id>", aliases=("state.checkpoints.create-subdir",)),
    Option(C + "cleaner.parallel-mode", Kind.BOOLEAN, "true", "discard a checkpoint's files in parallel", None, NOT_HERE, aliases=("state.checkpoint.cleaner.parallel-mode",)),
    Option(C + "data-inline-threshold", Kind.MEMORY, "20 kb", "state smaller than this is inlined in _metadata", None, NOT_HERE + ": every handle is a file", aliases=("state.storage.fs.memory-threshold", "state.backend.fs.memory-threshold")),
    Option(C + "write-buffer-size", Kind.INTEGER, "4096", "write buffer of checkpoint streams, bytes", None, NOT_HERE, aliases=("state.storage.fs.write-buffer-size", "state.backend.fs.write-buffer-size")),
    Option(C + "snapshot-compression", Kind.BOOLEAN, "false", "compress state snapshots", None, NOT_HERE + ": state files are Arrow IPC"),
    Option(C + "local-backup.enabled", Kind.BOOLEAN, "false", "a local copy of keyed state on the task manager's disk", "local_backup", "agent: with state on an object store, each checkpoint's copies are kept on the local disk of the machine that wrote them (files read or written there are kept locally always, as a cache)", aliases=("state.backend.local-recovery",)),
    Option(C + "local-backup.dirs", Kind.STRING, "(none)", "directories of local state copies", "local_backup_dirs", "agent: the first is used; default: <system temp dir>/sparkpoint-local-state", aliases=("taskmanager.state.local.root-dirs",)),
    Option("state.backend.memory.fixed-per-slot", Kind.MEMORY, "(none)", "memory a Python worker's keyed state may hold (modelled on Flink's state.backend.rocksdb.memory.fixed-per-slot)", "state_memory_bytes", "agent: files held in memory beyond it are dropped oldest first (files on local disk are memory-mapped, outside it), and runs merge only while their bytes fit in it", default_here="256 mb"),
    Option("state.changelog.periodic-materialize.interval", Kind.DURATION, "10 min", "how often a key group's runs of changes are folded into a new base (bounds the runs a checkpoint names and a restore reads)", "materialize_interval_ms", "agent: a sixteenth of a subtask's key groups per round at most"),
    Option(C + "file-merging.enabled", Kind.BOOLEAN, "false", "merge small checkpoint files into fewer files (FLIP-306)", "file_merging", "agent: a snapshot's new keyed-state files of one subtask are written as one merged file (more when they exceed max-file-size); each handle names the merged file, its offset and the state file's name; the coordinator counts references per merged file and deletes it when no retained checkpoint needs any of its segments"),
    Option(C + "file-merging.across-checkpoint-boundary", Kind.BOOLEAN, "false", "merged files shared across checkpoints", None, NOT_HERE + ": a merged file holds one checkpoint's copies (Flink's default)"),
    Option(C + "file-merging.max-file-size", Kind.MEMORY, "32 mb", "largest merged file", "file_merging_max_bytes", "agent: a state file larger than this is copied whole, as without merging"),
    Option(C + "file-merging.pool-blocking", Kind.BOOLEAN, "false", "blocking pool of merged files", None, NOT_HERE + ": each subtask's copies are written by one task, no pool"),
    Option(C + "file-merging.max-subtasks-per-file", Kind.INTEGER, "4", "subtasks sharing one merged file", None, NOT_HERE + ": one subtask per merged file (its copies are written on one thread)"),
    Option(C + "file-merging.max-space-amplification", Kind.DOUBLE, "2.0", "space amplification that triggers re-uploading merged files", None, NOT_HERE + ": segments are never re-uploaded; a merged file goes when no retained checkpoint references any of its segments"),
    # --- buffer debloating (FLIP-183): in-flight records bounded by time --------------------------------
    Option("taskmanager.network.memory.buffer-debloat.enabled", Kind.BOOLEAN, "false", "bound the in-flight data to what is processed within the target time", "buffer_debloat", "agent: each round reads at most the source records that fit in the target after a round's fixed cost (both fitted to recent rounds that read a backlog), shared by backlog; an aligned checkpoint, which waits for the round in flight, then waits about that long; a target at or below the fixed cost leaves reads unbounded (logged)"),
    Option("taskmanager.network.memory.buffer-debloat.target", Kind.DURATION, "1 s", "time in which the in-flight data should be consumed", "buffer_debloat_target_ms", "agent: the time a round should take"),
    Option("taskmanager.network.memory.buffer-debloat.samples", Kind.INTEGER, "20", "samples the throughput is averaged over", "buffer_debloat_samples", "agent: rounds the fit is made over"),
    # --- how long records may wait for a round (Flink's buffer timeout) ------------------------------
    Option("execution.buffer-timeout.interval", Kind.DURATION, "100 ms", "longest time records wait in an output buffer before it is sent (0: after every record)", "buffer_timeout_ms", "agent: without a backlog a round starts at most this often (a round of what arrived meanwhile, not one per record); with a backlog (the last read stopped at a bound, or the channels hold more than a round) rounds go back to back; 0: back to back always", default_here="0 ms: rounds back to back (measured: 100 ms saved little CPU and added about 0.3 s to the exactly-once p99 at 50,000 records/s)"),
    Option("execution.buffer-timeout.enabled", Kind.BOOLEAN, "true", "whether the buffer timeout applies (off: buffers are sent only when full)", None, NOT_HERE + ": a round never waits for a full batch; the interval always applies"),
    # --- sparkpoint's periodic savepoints (FLIP-10) --------------------------------------------------
    Option(C + "periodic-savepoint.interval", Kind.DURATION, "(none)", "take a savepoint this often (sparkpoint, FLIP-10)", "periodic_savepoint_interval_ms", "coordinator"),
    Option(C + "periodic-savepoint.num-retained", Kind.INTEGER, "3", "periodic savepoints kept, across runs of the job (sparkpoint, FLIP-10)", "periodic_savepoint_num_retained", "coordinator"),
    # --- restoring -----------------------------------------------------------------------------------
    Option(R + "path", Kind.STRING, "(none)", "the snapshot to restore from (what --restore sets)", "path", "agent", aliases=("execution.savepoint.path",)),
    Option(R + "claim-mode", Kind.ENUM, "NO_CLAIM", "CLAIM: the job owns the restored snapshot and may delete it; NO_CLAIM: never touched, the first checkpoint is full", "claim_mode", "agent and coordinator; LEGACY is read as NO_CLAIM", aliases=("execution.savepoint-restore-mode",), values=("CLAIM", "NO_CLAIM", "LEGACY")),
    Option(R + "ignore-unclaimed-state", Kind.BOOLEAN, "false", "drop snapshot state the job cannot map (what --allow-non-restored-state sets)", "ignore_unclaimed_state", "agent", aliases=("execution.savepoint.ignore-unclaimed-state",)),
    Option(R + "without-channel-state.checkpoint-id", Kind.LONG, "-1", "restore this checkpoint without its channel state", "without_channel_state_checkpoint_id", "agent: drops that checkpoint's channel state on restore, with a warning", aliases=("execution.checkpointing.recover-without-channel-state.checkpoint-id",)),
    Option(R + "from-local", Kind.BOOLEAN, "false", "recover keyed state from local copies", "from_local", "agent: a restore on the machine that kept local copies reads them instead of the object store; off: the job's local copies are removed first"),
    Option(R + "approximate-local-recovery", Kind.BOOLEAN, "false", "approximate local recovery (Flink internal)", None, NOT_HERE, aliases=("execution.checkpointing.approximate-local-recovery",)),
    # --- restart strategies ------------------------------------------------------------------------
    Option("restart-strategy.type", Kind.ENUM, "(none)", "none, fixed-delay, failure-rate or exponential-delay; unset: exponential-delay when checkpointing is on, else none", "type", "agent: restarts the job in its process", aliases=("restart-strategy",), values=("none", "off", "disable", "fixed-delay", "fixeddelay", "failure-rate", "failurerate", "exponential-delay", "exponentialdelay")),
    Option(S + "fixed-delay.attempts", Kind.INTEGER, "1", "restarts before the job fails", "fixed_delay_attempts", "agent"),
    Option(S + "fixed-delay.delay", Kind.DURATION, "1 s", "wait before each restart", "fixed_delay_ms", "agent"),
    Option(S + "failure-rate.max-failures-per-interval", Kind.INTEGER, "1", "failures within the interval the job survives", "failure_rate_max_failures", "agent"),
    Option(S + "failure-rate.failure-rate-interval", Kind.DURATION, "1 min", "the interval failures are counted in", "failure_rate_interval_ms", "agent"),
    Option(S + "failure-rate.delay", Kind.DURATION, "1 s", "wait before each restart", "failure_rate_delay_ms", "agent"),
    Option(S + "exponential-delay.initial-backoff", Kind.DURATION, "1 s", "wait before the first restart", "initial_backoff_ms", "agent"),
    Option(S + "exponential-delay.max-backoff", Kind.DURATION, "1 min", "longest wait between restarts", "max_backoff_ms", "agent"),
    Option(S + "exponential-delay.backoff-multiplier", Kind.DOUBLE, "1.5", "the wait grows by this factor per failure", "backoff_multiplier", "agent"),
    Option(S + "exponential-delay.reset-backoff-threshold", Kind.DURATION, "1 h", "running this long without failure resets the wait and the attempts", "reset_backoff_threshold_ms", "agent"),
    Option(S + "exponential-delay.jitter-factor", Kind.DOUBLE, "0.1", "random share of the wait added or taken off", "jitter_factor", "agent"),
    Option(S + "exponential-delay.attempts-before-reset-backoff", Kind.INTEGER, "infinite", "restarts before the job fails (reset with the wait)", "attempts_before_reset", "agent"),
)  # fmt: skip

OPTIONS: dict[str, Option] = {o.key: o for o in OPTIONS_LIST}
ALIASES: dict[str, str] = {alias: o.key for o in OPTIONS_LIST for alias in o.aliases}
REST_OPTIONS: dict[str, Option] = {o.rest: o for o in OPTIONS_LIST if o.rest is not None}
"""PATCH field -> option."""


class ConfigError(ValueError):
    """A setting is invalid; ``field`` names it (option name or REST field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownOption(ValueError):
    def __init__(self, key: str, suggestion: str | None) -> None:
        hint = f" (did you mean {suggestion}?)" if suggestion else ""
        super().__init__(f"unknown option {key}{hint}")
        self.key = key
        self.suggestion = suggestion


def in_families(key: str) -> bool:
    """A key read here: of the families, or one of the few options outside them (the state
    backend's: ``state.changelog.*``, ``state.backend.memory.*``)."""
    return key.startswith(FAMILIES) or key in ALIASES or key in OPTIONS or key == "restart-strategy"


def canonical_key(key: str) -> str:
    """The option's Flink 2.x key (an older alias resolved); raises `UnknownOption` with the
    closest known key for a key of these families that Flink does not have."""
    if key in OPTIONS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    close = difflib.get_close_matches(key, [*OPTIONS, *ALIASES], n=1, cutoff=0.6)
    raise UnknownOption(key, close[0] if close else None)


def normalise(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of these families under their Flink 2.x keys (aliases resolved; a key given
    twice, once by an alias, keeps the value of its current name). Other keys are left out."""
    found: dict[str, Any] = {}
    from_alias: set[str] = set()
    for key, value in options.items():
        if not in_families(key):
            continue
        name = canonical_key(key)
        if name in found and key != name and name not in from_alias:
            continue  # the current name wins over an alias
        found[name] = value
        if key != name:
            from_alias.add(name)
        else:
            from_alias.discard(name)
    return found


def without_effect(options: Mapping[str, Any]) -> list[str]:
    """The keys given that have no effect here (Flink 2.x names), for one warning line."""
    return sorted(k for k in normalise(options) if not OPTIONS[k].takes_effect)


def markdown_table() -> str:
    """The option table of docs/settings.md."""
    lines = [
        "| option | type | Flink default | here | PATCH field | takes effect |",
        "|---|---|---|---|---|---|",
    ]
    for o in OPTIONS_LIST:
        kind = o.kind.value + (
            f" ({' / '.join(o.values)})"
            if o.values and o.kind is Kind.ENUM and len(o.values) <= 3
            else ""
        )
        here = o.default_here or "same"
        aliases = f" (also {', '.join(f'`{a}`' for a in o.aliases)})" if o.aliases else ""
        rest = f"`{o.rest}`" if o.rest else ""
        effect = ("yes: " if o.takes_effect else "no: ") + (o.effect or "")
        lines.append(
            f"| `{o.key}`{aliases}: {o.meaning} | {kind} | {o.default} | {here} | {rest} | {effect.rstrip(': ')} |"
        )
    return "\n".join(lines) + "\n"


# --- values ------------------------------------------------------------------------------------------

_UNITS_MS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip
_DURATION = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_MEMORY = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_MEMORY_UNITS = {
    "": 1, "b": 1, "bytes": 1, "k": 1024, "kb": 1024, "kibibytes": 1024, "m": 1024**2,
    "mb": 1024**2, "mebibytes": 1024**2, "g": 1024**3, "gb": 1024**3, "gibibytes": 1024**3,
    "t": 1024**4, "tb": 1024**4, "tebibytes": 1024**4,
}  # fmt: skip
INFINITE = 2**31 - 1
"""What Flink's "infinite" attempt count stands for (Integer.MAX_VALUE)."""


def parse_duration(text: str | int) -> int:
    """Milliseconds from Flink's duration syntax; a bare number is milliseconds."""
    if isinstance(text, int):
        return text
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 500ms, 30s, 10min, 1h)")
    number, unit = match.groups()
    factor = _UNITS_MS.get(unit.lower() or "ms")
    if factor is None:
        raise ValueError(f"{text!r}: unknown unit {unit!r} (ms, s, min, h, d)")
    return int(number) * factor


def format_duration(ms: int) -> str:
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def parse_memory(text: str | int) -> int:
    if isinstance(text, int):
        return text
    match = _MEMORY.match(str(text))
    factor = _MEMORY_UNITS.get(match.group(2).lower()) if match else None
    if match is None or factor is None:
        raise ValueError(f"{text!r} is not a memory size (e.g. 20 kb, 32 mb)")
    return int(match.group(1)) * factor


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError(f"{text!r} is not true or false")


def parse_int(text: str | int) -> int:
    if isinstance(text, str) and text.strip().lower() == "infinite":
        return INFINITE
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a whole number") from None


def parse_float(text: str | float) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number") from None


def _is_none(raw: Any) -> bool:
    return raw is None or str(raw).strip().lower() in ("", "none", "(none)")


def parse_value(option: Option, raw: Any) -> Any:
    """A raw value (YAML or string) as the option's type; None where Flink's option is unset.
    Raises ValueError saying what is wrong."""
    kind = option.kind
    if kind is Kind.ENUM and str(raw).strip().lower() in (v.lower() for v in option.values):
        return next(v for v in option.values if v.lower() == str(raw).strip().lower())
    if _is_none(raw) and option.default == "(none)":
        return None
    if kind is Kind.DURATION:
        return parse_duration(raw)
    if kind is Kind.BOOLEAN:
        return parse_bool(raw)
    if kind in (Kind.INTEGER, Kind.LONG):
        return parse_int(raw)
    if kind is Kind.DOUBLE:
        return parse_float(raw)
    if kind is Kind.MEMORY:
        return parse_memory(raw)
    if kind is Kind.ENUM:
        text = str(raw.value if isinstance(raw, enum.Enum) else raw).strip()
        for value in option.values:
            if value.lower() == text.lower():
                return value
        raise ValueError(f"{text!r} is not one of {', '.join(option.values)}")
    return str(raw)


def parse_section(options: Mapping[str, Any], section: Section) -> dict[str, Any]:
    """The values the given options set in one section's configuration, by attribute: keys
    resolved (an unknown key of the families is an error naming the closest one), values parsed
    (a bad value is an error naming its option); options with no effect here are left out."""
    try:
        normalised = normalise(options)
    except UnknownOption as exc:
        hint = f" (did you mean {exc.suggestion}?)" if exc.suggestion else ""
        raise ConfigError(exc.key, f"unknown option{hint}") from None
    values: dict[str, Any] = {}
    for key, raw in normalised.items():
        option = OPTIONS[key]
        if option.section is not section or option.field is None:
            continue
        try:
            values[option.field] = parse_value(option, raw)
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from None
    return values


if __name__ == "__main__":
    print(markdown_table(), end="")
