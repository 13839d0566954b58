"""What a job declares of event time: where a record's timestamp is and how watermarks follow
it (Flink's ``WatermarkStrategy``, with its builder's names).

A watermark W says: no record with a timestamp at or below W is expected any more. Bounded
out-of-orderness makes W = (the highest timestamp seen) - (the allowed lateness) - 1 ms, per
source partition, as Flink's ``BoundedOutOfOrdernessWatermarks`` does; monotonous timestamps are
the case of no out-of-orderness. Timestamps and watermarks are milliseconds since the epoch
(Flink's long); before any record a watermark is `MIN_WATERMARK`, and at the end of a bounded
input it is `MAX_WATERMARK`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sparkpoint.common.options import parse_duration

MIN_WATERMARK = -(2**63)
"""Flink's Long.MIN_VALUE: no watermark yet."""
MAX_WATERMARK = 2**63 - 1
"""Flink's Long.MAX_VALUE: the end of a bounded input (every event-time timer fires)."""
KAFKA_TIMESTAMP_COLUMN = "timestamp"
"""Where a Kafka record's own timestamp goes when no column is named (Spark's Kafka source
calls it ``timestamp`` too): milliseconds since the epoch, added before the job's map."""


def _millis(value: str | int, what: str, minimum: int) -> int:
    millis = parse_duration(value)
    if millis < minimum:
        raise ValueError(f"{what} must be at least {minimum} ms, got {value!r}")
    return millis


@dataclass(frozen=True)
class WatermarkStrategy:
    """Event time and watermarks for a source::

    WatermarkStrategy.for_bounded_out_of_orderness("5s")
        .with_timestamp_column("ts")          # default: the Kafka record's timestamp
        .with_idleness("1m")
        .with_watermark_alignment("payments", "30s")
    """

    max_out_of_orderness_ms: int = 0
    timestamp_column: str | None = None
    """The column (after decoding, before the job's map) holding each record's event time:
    integers in ms since the epoch, or datetimes. None: the Kafka record timestamp, as column
    `KAFKA_TIMESTAMP_COLUMN`."""
    idle_timeout_ms: int | None = None
    """A partition that brings no record for this long stops holding the watermark back
    (Flink's ``withIdleness``); it counts again with its next record."""
    alignment_group: str | None = None
    max_drift_ms: int | None = None
    """Flink's ``withWatermarkAlignment``: a partition whose watermark is more than this ahead
    of the slowest partition's is not read until the slowest catches up."""

    def __post_init__(self) -> None:
        if self.max_out_of_orderness_ms < 0:
            raise ValueError("max out-of-orderness must not be negative")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms < 1:
            raise ValueError("the idle timeout must be positive")
        if self.max_drift_ms is not None and self.max_drift_ms < 0:
            raise ValueError("the maximum drift must not be negative")
        if self.timestamp_column is not None and not self.timestamp_column:
            raise ValueError("the timestamp column must be named")

    # --- Flink's builder --------------------------------------------------------------------------

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: str | int) -> WatermarkStrategy:
        """Records may arrive up to ``max_out_of_orderness`` (``5s``, ``200ms``; a bare number
        is ms) after a record with a later timestamp."""
        return WatermarkStrategy(_millis(max_out_of_orderness, "max out-of-orderness", 0))

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        return WatermarkStrategy(0)

    def with_timestamp_column(self, column: str) -> WatermarkStrategy:
        return dataclasses.replace(self, timestamp_column=column)

    def with_idleness(self, timeout: str | int) -> WatermarkStrategy:
        return dataclasses.replace(self, idle_timeout_ms=_millis(timeout, "the idle timeout", 1))

    def with_watermark_alignment(self, group: str, max_drift: str | int) -> WatermarkStrategy:
        return dataclasses.replace(
            self, alignment_group=group, max_drift_ms=_millis(max_drift, "the maximum drift", 0)
        )

    # --- what it means ----------------------------------------------------------------------------

    @property
    def column(self) -> str:
        """The column that holds event time in stage 1's and stage 2's records."""
        return self.timestamp_column or KAFKA_TIMESTAMP_COLUMN

    def watermark(self, max_timestamp: int | None) -> int:
        """The watermark of a partition whose highest timestamp so far is ``max_timestamp``."""
        if max_timestamp is None:
            return MIN_WATERMARK
        return max(MIN_WATERMARK, max_timestamp - self.max_out_of_orderness_ms - 1)


def event_times(column: pd.Series) -> np.ndarray:
    """A timestamp column as int64 milliseconds since the epoch: integers as they are,
    datetimes (naive ones read as UTC) converted. Anything else is refused, naming the column."""
    if pd.api.types.is_datetime64_any_dtype(column):
        values = column.dt.tz_convert("UTC") if column.dt.tz is not None else column
        return np.asarray(values.to_numpy(dtype="datetime64[ms]").astype(np.int64))
    if pd.api.types.is_integer_dtype(column) or pd.api.types.is_float_dtype(column):
        if column.isna().any():
            raise ValueError(f"event time column {column.name!r} holds nulls")
        return np.asarray(column.to_numpy().astype(np.int64))
    raise TypeError(
        f"event time column {column.name!r} must hold integers (ms since the epoch) or "
        f"datetimes, not {column.dtype}"
    )
