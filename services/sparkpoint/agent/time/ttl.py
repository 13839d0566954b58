"""State time-to-live, with Flink's `StateTtlConfig` meaning (pyflink's builder names).

A state declared with a TTL keeps, beside each entry (a value, a list element, a map entry),
the processing time it was last written (or read, with `UpdateType.ON_READ_AND_WRITE`) in a
companion state named `ttl_state_name`: the same kind, indexed as the state, with int64
milliseconds. The companion is keyed state like any other, so the timestamps are in every
checkpoint and savepoint and move with their key groups on a rescale; the TTL itself is read
from the job, so a restore may change it (Flink stores the last access time too).

An entry expires once ``last access + ttl <= now``:

- a function never sees an expired entry (`StateVisibility.NEVER_RETURN_EXPIRED`, the
  default); reading it removes it, as Flink's TTL state clears an expired value it reads;
- entries nobody reads again go when their key group is folded into a new base (the periodic
  materialization and canonical savepoints), Flink's compaction-filter cleanup: one vectorized
  comparison within a fold that reads those rows anyway, never a scan of its own.

Time is processing time only, as in Flink.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from sparkpoint.common.options import parse_duration

TTL_PREFIX = "__ttl__:"


def ttl_state_name(name: str) -> str:
    """The companion state that holds ``name``'s last-access timestamps."""
    return TTL_PREFIX + name


class UpdateType(enum.Enum):
    """When an entry's timestamp is refreshed (Flink's ``StateTtlConfig.UpdateType``)."""

    ON_CREATE_AND_WRITE = "OnCreateAndWrite"
    ON_READ_AND_WRITE = "OnReadAndWrite"


class StateVisibility(enum.Enum):
    """Whether an expired entry that is still stored is returned (Flink's names)."""

    NEVER_RETURN_EXPIRED = "NeverReturnExpired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "ReturnExpiredIfNotCleanedUp"


@dataclass(frozen=True)
class StateTtlConfig:
    """A state's time-to-live: ``StateTtlConfig.new_builder("1h").build()``, then
    ``ValueState("int64", ttl=config)`` (or ``.enable_time_to_live(config)`` on a descriptor)."""

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup_on_fold: bool = True
    """Expired entries are dropped when their key group is folded into a new base (Flink's
    ``cleanupInRocksdbCompactFilter``, on by default there too)."""

    def __post_init__(self) -> None:
        if self.ttl_ms <= 0:
            raise ValueError(f"a state TTL must be positive, got {self.ttl_ms} ms")

    @staticmethod
    def new_builder(ttl: str | int) -> StateTtlConfig:
        """A config of ``ttl`` (milliseconds, or a duration: ``"30s"``, ``"10min"``, ``"1d"``)."""
        return StateTtlConfig(parse_duration(ttl))

    def set_update_type(self, update_type: UpdateType) -> StateTtlConfig:
        return replace(self, update_type=update_type)

    def update_ttl_on_create_and_write(self) -> StateTtlConfig:
        return self.set_update_type(UpdateType.ON_CREATE_AND_WRITE)

    def update_ttl_on_read_and_write(self) -> StateTtlConfig:
        return self.set_update_type(UpdateType.ON_READ_AND_WRITE)

    def set_state_visibility(self, visibility: StateVisibility) -> StateTtlConfig:
        return replace(self, visibility=visibility)

    def never_return_expired(self) -> StateTtlConfig:
        return self.set_state_visibility(StateVisibility.NEVER_RETURN_EXPIRED)

    def return_expired_if_not_cleaned_up(self) -> StateTtlConfig:
        return self.set_state_visibility(StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)

    def cleanup_in_rocksdb_compact_filter(self, _queries: int = 1000) -> StateTtlConfig:
        """Flink's name for cleanup while the backend compacts: here, while a key group is
        folded into a new base (the argument, Flink's query interval, has no use here)."""
        return replace(self, cleanup_on_fold=True)

    def disable_cleanup_in_background(self) -> StateTtlConfig:
        """Expired entries go only when read (they stay stored, and in checkpoints, until
        then)."""
        return replace(self, cleanup_on_fold=False)

    def build(self) -> StateTtlConfig:
        return self

    @property
    def refreshed_on_read(self) -> bool:
        return self.update_type is UpdateType.ON_READ_AND_WRITE

    @property
    def returns_expired(self) -> bool:
        return self.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
