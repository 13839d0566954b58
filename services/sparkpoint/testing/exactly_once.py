"""Committed output against a reference, as multisets of rows: what is missing, what came more
than once, what should not be there at all, each with a count and a few examples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

EXAMPLES = 3


class ExactlyOnceViolation(AssertionError):
    """The output is not the reference exactly once. Its fields say how."""

    def __init__(
        self,
        missing: Counter[Hashable],
        duplicated: Counter[Hashable],
        unexpected: Counter[Hashable],
        columns: Sequence[str],
        got: int,
        want: int,
    ) -> None:
        self.missing = missing
        self.duplicated = duplicated
        self.unexpected = unexpected
        self.columns = list(columns)
        lines = [f"output is not the reference exactly once ({got} rows, expected {want})"]
        for label, found, what in (
            ("missing", missing, "in the reference, never in the output"),
            ("duplicated", duplicated, "in the output more often than in the reference"),
            ("unexpected", unexpected, "in the output, not in the reference"),
        ):
            if found:
                total = sum(found.values())
                examples = "; ".join(
                    _shown(row, n, columns) for row, n in list(found.items())[:EXAMPLES]
                )
                lines.append(f"  {total} {label} ({what}), e.g. {examples}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Comparison:
    missing: Counter[Hashable]
    duplicated: Counter[Hashable]
    unexpected: Counter[Hashable]

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)


def compare(output: Any, reference: Any, columns: Sequence[str] | None = None) -> Comparison:
    """Output and reference as multisets of rows (a row of the output is a copy of a reference
    row when all ``columns`` are equal; default: the reference's columns)."""
    got, want, _ = _both(output, reference, columns)
    have, need = Counter(got), Counter(want)
    missing = need - have
    extra = have - need
    duplicated = Counter({row: n for row, n in extra.items() if row in need})
    unexpected = Counter({row: n for row, n in extra.items() if row not in need})
    return Comparison(missing, duplicated, unexpected)


def assert_exactly_once(output: Any, reference: Any, columns: Sequence[str] | None = None) -> None:
    """Passes when ``output`` holds every row of ``reference`` exactly as often (any order);
    else raises `ExactlyOnceViolation` naming the missing, duplicated and unexpected rows with
    a few examples each. Rows: a DataFrame, dicts or tuples; ``columns`` chooses which columns
    are compared (default: the reference's; the output may carry more, such as an offset)."""
    got, want, names = _both(output, reference, columns)
    found = compare(output, reference, columns)
    if not found.exact:
        raise ExactlyOnceViolation(
            found.missing, found.duplicated, found.unexpected, names, len(got), len(want)
        )


def _both(
    output: Any, reference: Any, columns: Sequence[str] | None
) -> tuple[list[Hashable], list[Hashable], list[str]]:
    """Both sides' rows over the same columns: ``columns``, else the reference's, else the
    output's (rows given as tuples have none: they are compared whole)."""
    out, ref = _frame(output), _frame(reference)
    if columns is not None:
        names = list(columns)
    elif ref is not None:
        names = list(ref.columns)
    elif out is not None:
        names = list(out.columns)
    else:
        names = []
    return _rows(output, out, names), _rows(reference, ref, names), names


def _frame(rows: Any) -> pd.DataFrame | None:
    """Rows as a DataFrame, when they have column names (a DataFrame, or dicts)."""
    if isinstance(rows, pd.DataFrame):
        return rows
    items = list(rows) if isinstance(rows, Iterable) else []
    if items and isinstance(items[0], Mapping):
        return pd.DataFrame(items)
    return None


def _rows(rows: Any, frame: pd.DataFrame | None, names: list[str]) -> list[Hashable]:
    """Hashable rows (tuples of plain values) over ``names``."""
    if frame is None:
        items = list(rows) if isinstance(rows, Iterable) else []
        return [tuple(_plain(v) for v in r) if isinstance(r, tuple | list) else _plain(r) for r in items]  # fmt: skip
    if not len(frame):
        return []
    absent = [c for c in names if c not in frame.columns]
    if absent:
        raise KeyError(f"columns {absent} are not in the rows (they have {list(frame.columns)})")
    values = frame[names].astype(object).to_numpy().tolist()
    return [tuple(_plain(v) for v in row) for row in values]


def _plain(value: Any) -> Hashable:
    """numpy scalars as Python's, so 3 == np.int64(3) as a row member; lists as tuples."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        try:
            return value.item()  # type: ignore[no-any-return]
        except (ValueError, AttributeError):
            pass
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    return value  # type: ignore[no-any-return]


def _shown(row: Hashable, count: int, columns: Sequence[str]) -> str:
    shown = dict(zip(columns, row, strict=False)) if columns and isinstance(row, tuple) else row
    return f"{shown!r}" + (f" x{count}" if count > 1 else "")
