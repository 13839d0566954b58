"""Key groups, exactly as Flink's KeyGroupRangeAssignment.

A key's key group is ``murmurHash(hashCode(key)) % max_parallelism``; subtask i of p owns the
contiguous key-group range Flink computes for operator index i. State is kept per key group, so a
restore with another parallelism moves whole key groups.

``hashCode`` is Java's for the key's type (String, Long, Boolean, Double, byte arrays, tuples as
Flink's Tuple types), so a job keyed by strings or longs puts each key in the same key group as a
Flink job would. ``murmurHash`` is Flink's MathUtils.murmurHash, which is MurmurHash3_x86_32 of
the hash code's four little-endian bytes with seed 0, made non-negative.

`key_groups` does the same for whole columns: vectorized with numpy for integer columns, once
per distinct value for the others (keys repeat, records far outnumber distinct keys), and a
string key's hash kept between calls (a worker sees the same keys round after round).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_MAX_PARALLELISM = 128
"""Flink's lower bound for a default max parallelism (and sparkpoint's default)."""

UPPER_BOUND_MAX_PARALLELISM = 1 << 15
"""Flink's upper bound: key-group arithmetic stays within 32-bit ints below it."""

_MASK32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _int32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    h ^= h >> 16
    return h


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 as a signed 32-bit int (as Java returns it)."""
    h = seed & _MASK32
    length = len(data)
    blocks = length - length % 4
    for i in range(0, blocks, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (_rotl((k * _C1) & _MASK32, 15) * _C2) & _MASK32
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _MASK32
    k = 0
    tail = data[blocks:]
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if tail:
        k ^= tail[0]
        k = (_rotl((k * _C1) & _MASK32, 15) * _C2) & _MASK32
        h ^= k
    return _int32(_fmix(h ^ length))


def murmur_hash(code: int) -> int:
    """Flink's MathUtils.murmurHash: a non-negative hash of a 32-bit int."""
    k = (_rotl((code * _C1) & _MASK32, 15) * _C2) & _MASK32
    h = _int32(_fmix(((_rotl(k, 13) * 5 + 0xE6546B64) & _MASK32) ^ 4))
    if h >= 0:
        return h
    return 0 if h == -(1 << 31) else -h


def java_hash(key: Any) -> int:
    """Java's hashCode for the key's natural Java type; None is not a key."""
    if key is None:
        raise ValueError("a key must not be None (Flink: 'Assigned key must not be null!')")
    if isinstance(key, bool):
        return 1231 if key else 1237
    if isinstance(key, int | np.integer):
        value = int(key)
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"integer key {value} does not fit a Java long")
        unsigned = value & 0xFFFFFFFFFFFFFFFF
        return _int32(unsigned ^ (unsigned >> 32))  # Long.hashCode
    if isinstance(key, str):
        h = 0
        for unit in struct.unpack(
            f"<{len(key.encode('utf-16-le')) // 2}H", key.encode("utf-16-le")
        ):
            h = (31 * h + unit) & _MASK32  # String.hashCode over UTF-16 code units
        return _int32(h)
    if isinstance(key, float | np.floating):
        (bits,) = struct.unpack("<Q", struct.pack("<d", float(key) if key == key else float("nan")))
        return _int32(bits ^ (bits >> 32))  # Double.hashCode (canonical NaN)
    if isinstance(key, bytes | bytearray):
        h = 1
        for byte in key:
            h = (31 * h + (byte - 256 if byte > 127 else byte)) & _MASK32  # Arrays.hashCode(byte[])
        return _int32(h)
    if isinstance(key, tuple):
        h = java_hash(key[0]) if key else 0  # Flink's TupleN.hashCode
        for field in key[1:]:
            h = (31 * h + java_hash(field)) & _MASK32
        return _int32(h)
    raise TypeError(
        f"{type(key).__name__} keys are not supported (use str, int, float, bool, bytes or tuples)"
    )


def check_max_parallelism(max_parallelism: int) -> None:
    if not 0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(
            f"max parallelism must be within 1..{UPPER_BOUND_MAX_PARALLELISM}, got {max_parallelism}"
        )


def key_group(key: Any, max_parallelism: int) -> int:
    """Flink's assignToKeyGroup."""
    return murmur_hash(java_hash(key)) % max_parallelism


def operator_index(max_parallelism: int, parallelism: int, group: int) -> int:
    """Flink's computeOperatorIndexForKeyGroup: the subtask that owns a key group."""
    return group * parallelism // max_parallelism


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """Key groups ``start`` to ``end``, both inclusive (Flink's KeyGroupRange)."""

    start: int
    end: int

    def __contains__(self, group: object) -> bool:
        return isinstance(group, int) and self.start <= group <= self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __iter__(self) -> Any:
        return iter(range(self.start, self.end + 1))


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """Flink's computeKeyGroupRangeForOperatorIndex."""
    check_max_parallelism(max_parallelism)
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be within 1..{max_parallelism}, got {parallelism}")
    if not 0 <= index < parallelism:
        raise ValueError(f"subtask index must be within 0..{parallelism - 1}, got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def default_max_parallelism(parallelism: int) -> int:
    """Flink's computeDefaultMaxParallelism: 1.5 x parallelism rounded up to a power of two,
    at least 128, at most 32768."""
    wanted = parallelism + parallelism // 2
    power = 1 << (wanted - 1).bit_length() if wanted > 1 else 1
    return min(max(power, DEFAULT_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


# --- whole columns ------------------------------------------------------------------------------------


def _murmur_hash_array(codes: npt.NDArray[np.uint32]) -> npt.NDArray[np.int64]:
    with np.errstate(over="ignore"):
        k = codes * np.uint32(_C1)
        k = (k << np.uint32(15)) | (k >> np.uint32(17))
        k = k * np.uint32(_C2)
        h = (k << np.uint32(13)) | (k >> np.uint32(19))
        h = h * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(4)
        h ^= h >> np.uint32(16)
        h = h * np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h = h * np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    signed = h.view(np.int32).astype(np.int64)
    return np.where(signed == np.iinfo(np.int32).min, 0, np.abs(signed))


def key_groups(
    keys: Sequence[Any] | npt.NDArray[Any], max_parallelism: int
) -> npt.NDArray[np.int32]:
    """The key group of every key in a column, as `key_group` gives it for one key."""
    check_max_parallelism(max_parallelism)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu" and keys.dtype != np.uint64:
        longs = keys.astype(np.int64).view(np.uint64)
        codes = (longs ^ (longs >> np.uint64(32))).astype(np.uint32)  # Long.hashCode
        return (_murmur_hash_array(codes) % max_parallelism).astype(np.int32)
    array = keys if isinstance(keys, np.ndarray) else np.asarray(keys)
    if array.ndim == 1 and (
        array.dtype.kind == "U" or (array.dtype == object and _all_strings(array))
    ):
        return _string_key_groups(array, max_parallelism)
    if array.ndim == 1 and array.dtype.kind in "Sfb":
        # hash each distinct key once (numpy's unique is C), then spread the groups back
        distinct, positions = np.unique(array, return_inverse=True)
        groups = np.fromiter(
            (key_group(k, max_parallelism) for k in distinct.tolist()),
            dtype=np.int32,
            count=len(distinct),
        )
        return groups[positions.reshape(-1)]
    # tuples, mixed types: a dictionary of distinct keys, by type too (1, 1.0 and True are one
    # key of a dictionary, three Java hash codes)
    cache: dict[tuple[type, Any], int] = {}
    out = np.empty(len(keys), dtype=np.int32)
    for i, key in enumerate(keys):
        key = key.item() if isinstance(key, np.generic) else key
        group = cache.get((type(key), key))
        if group is None:
            group = cache[(type(key), key)] = key_group(key, max_parallelism)
        out[i] = group
    return out


STRING_HASHES_KEPT = 200_000
"""Strings whose murmur hash `_string_key_groups` keeps between calls, at most (about 30 MB);
the kept ones are forgotten all at once when that many are kept."""

_string_hashes: dict[str, int] = {}


def _all_strings(keys: npt.NDArray[Any]) -> bool:
    import pandas as pd

    return bool(pd.api.types.infer_dtype(keys, skipna=False) == "string")


def _string_key_groups(keys: npt.NDArray[Any], max_parallelism: int) -> npt.NDArray[np.int32]:
    """Key groups of a column of strings (numpy's, or pandas' object column): distinct values by
    pandas' hash table, each hashed once, and a string's hash kept for the calls after: a worker
    sees the same keys round after round, and hashing a string's UTF-16 code units in Python
    takes about 3 us, a hundred times a lookup (a stage-1 task's key groups of 50,000 records
    over 10,000 keys: 56 ms before, 6 ms with the hashes kept)."""
    import pandas as pd

    codes, distinct = pd.factorize(keys)
    hashes = np.empty(len(distinct), dtype=np.int64)
    kept = _string_hashes
    for i, key in enumerate(distinct.tolist()):
        found = kept.get(key)
        if found is None:
            if len(kept) >= STRING_HASHES_KEPT:
                kept.clear()
            found = kept[key] = murmur_hash(java_hash(key))
        hashes[i] = found
    groups: npt.NDArray[np.int32] = (hashes % max_parallelism).astype(np.int32)[codes]
    return groups


def operator_indexes(
    max_parallelism: int, parallelism: int, groups: npt.NDArray[np.int32]
) -> npt.NDArray[np.int64]:
    """`operator_index` of every key group in a column."""
    return groups.astype(np.int64) * parallelism // max_parallelism
