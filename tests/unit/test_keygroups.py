"""Key groups as Flink's KeyGroupRangeAssignment computes them."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pandas as pd
import pytest

from sparkpoint.common import keygroups
from sparkpoint.common.keygroups import (
    KeyGroupRange,
    default_max_parallelism,
    java_hash,
    key_group,
    key_group_range,
    key_groups,
    murmur3_32,
    murmur_hash,
    operator_index,
    operator_indexes,
)

# Kafka streams' Murmur3Test vectors (MurmurHash3_x86_32, seed 123)
MURMUR3_VECTORS = [
    (b"21", 896581614),
    (b"foobar", -328928243),
    (b"a-little-bit-long-string", -1479816207),
    (b"a-little-bit-longer-string", -153232333),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", 13417721),
    (b"abc", 461137560),
]


@pytest.mark.parametrize(("data", "expected"), MURMUR3_VECTORS)
def test_murmur3_32_matches_the_reference_vectors(data: bytes, expected: int) -> None:
    assert murmur3_32(data, seed=123) == expected


def test_flinks_murmur_hash_is_murmur3_of_the_four_bytes_made_non_negative() -> None:
    rng = random.Random(5)
    codes = [0, 1, -1, 2, 2**31 - 1, -(2**31)] + [
        rng.randint(-(2**31), 2**31 - 1) for _ in range(2000)
    ]
    for code in codes:
        expected = abs(murmur3_32((code & 0xFFFFFFFF).to_bytes(4, "little")))
        assert murmur_hash(code) == (0 if expected == 2**31 else expected)
        assert murmur_hash(code) >= 0


@pytest.mark.parametrize(
    ("key", "hash_code"),
    [
        ("hello", 99162322),  # "hello".hashCode()
        ("", 0),
        ("Aa", 2112),  # the classic collision with "BB"
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # hashes to Integer.MIN_VALUE
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # surrogate pair: two UTF-16 code units
        (1 << 32, 1),  # Long.hashCode
        (-1, 0),
        (42, 42),
        (True, 1231),  # Boolean.hashCode
        (False, 1237),
        (1.0, 1072693248),  # Double.hashCode
        (("a", 1), 31 * 97 + 1),  # Tuple2.hashCode
        (b"\x01\x02", (31 * (31 * 1 + 1) + 2)),  # Arrays.hashCode(byte[])
    ],
)
def test_java_hash_codes(key: object, hash_code: int) -> None:
    assert java_hash(key) == hash_code


def test_none_and_unsupported_keys_are_errors() -> None:
    with pytest.raises(ValueError):
        java_hash(None)
    with pytest.raises(TypeError):
        java_hash({"a": 1})
    with pytest.raises(ValueError):
        java_hash(1 << 70)


def test_ranges_for_128_key_groups_over_3_subtasks() -> None:
    ranges = [key_group_range(128, 3, i) for i in range(3)]
    assert ranges == [KeyGroupRange(0, 42), KeyGroupRange(43, 85), KeyGroupRange(86, 127)]
    assert [len(r) for r in ranges] == [43, 43, 42]


@pytest.mark.parametrize("max_parallelism", [1, 2, 7, 16, 33, 128])
def test_ranges_are_contiguous_cover_everything_and_agree_with_operator_index(
    max_parallelism: int,
) -> None:
    for parallelism in range(1, max_parallelism + 1):
        ranges = [key_group_range(max_parallelism, parallelism, i) for i in range(parallelism)]
        assert ranges[0].start == 0 and ranges[-1].end == max_parallelism - 1
        assert all(a.end + 1 == b.start for a, b in itertools.pairwise(ranges))
        for index, owned in enumerate(ranges):
            assert all(operator_index(max_parallelism, parallelism, g) == index for g in owned)


def test_rescaling_moves_whole_key_groups() -> None:
    keys = [f"customer-{i}" for i in range(5000)]
    groups = {k: key_group(k, 128) for k in keys}
    for parallelism in (1, 2, 4, 3):
        owners = {k: operator_index(128, parallelism, g) for k, g in groups.items()}
        for key, group in groups.items():
            assert group in key_group_range(128, parallelism, owners[key])
    assert len(set(groups.values())) == 128  # 5000 keys reach every key group


@pytest.mark.parametrize(
    ("parallelism", "expected"), [(1, 128), (85, 128), (86, 256), (100, 256), (30000, 32768)]
)
def test_default_max_parallelism(parallelism: int, expected: int) -> None:
    assert default_max_parallelism(parallelism) == expected


def test_invalid_parallelism_is_an_error() -> None:
    with pytest.raises(ValueError):
        key_group_range(128, 129, 0)
    with pytest.raises(ValueError):
        key_group_range(0, 1, 0)
    with pytest.raises(ValueError):
        key_group_range(128, 4, 4)


def test_columns_give_the_same_groups_as_single_keys() -> None:
    rng = np.random.default_rng(11)
    longs = np.concatenate(
        [rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64), [0, -1, 2**63 - 1, -(2**63)]]
    )
    ints = rng.integers(-1000, 1000, 500, dtype=np.int32)
    strings = [f"user-{i % 97}" for i in range(1000)]
    floats = rng.normal(size=200)
    tuples = [(f"k{i % 5}", i % 3) for i in range(50)]
    for column in (longs, ints, strings, np.array(strings), floats, tuples, [True, False, True]):
        assert key_groups(column, 128).tolist() == [
            key_group(k.item() if hasattr(k, "item") else k, 128) for k in column
        ]
    assert key_groups([], 128).tolist() == []


def test_a_pandas_string_column_gives_each_keys_group_also_from_kept_hashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keygroups, "_string_hashes", {})
    monkeypatch.setattr(keygroups, "STRING_HASHES_KEPT", 50)  # forgotten now and then
    rng = random.Random(5)
    for _ in range(4):  # calls after the first find most hashes kept
        column = pd.Series([f"u{rng.randrange(120)}" for _ in range(400)] + ["ü€𝄞"]).to_numpy()
        assert column.dtype == object
        for max_parallelism in (128, 7):
            expected = [key_group(k, max_parallelism) for k in column]
            assert key_groups(column, max_parallelism).tolist() == expected
    assert 0 < len(keygroups._string_hashes) <= 50


def test_an_object_column_of_mixed_types_keeps_one_true_and_one_point_zero_apart() -> None:
    # equal as dictionary keys, three Java hash codes: Long 1, Boolean true, Double 1.0
    column = pd.Series([1, True, 1.0, "1", (1, "a"), b"x", 2**40, 1]).to_numpy()
    assert column.dtype == object
    assert key_groups(column, 128).tolist() == [key_group(k, 128) for k in column]
    assert len({key_group(k, 128) for k in (1, True, 1.0)}) == 3


def test_operator_indexes_of_a_column_are_operator_index_of_each_group() -> None:
    groups = np.arange(128, dtype=np.int32)
    for parallelism in (1, 3, 4, 128):
        expected = [operator_index(128, parallelism, int(g)) for g in groups]
        assert operator_indexes(128, parallelism, groups).tolist() == expected


def test_records_split_by_subtask_keep_their_order_within_each_subtask() -> None:
    from sparkpoint.agent.rounds.fetch import by_subtask
    from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN

    frame = pd.DataFrame({"k": [f"key-{i % 37}" for i in range(500)], "n": range(500)})
    parts = by_subtask(frame, "k", 128, 3)
    assert [s for s, _ in parts] == sorted({s for s, _ in parts})
    assert sum(len(p) for _, p in parts) == 500
    for subtask, part in parts:
        assert part["n"].is_monotonic_increasing and part.index.tolist() == list(range(len(part)))
        owners = operator_indexes(128, 3, part[KEY_GROUP_COLUMN].to_numpy())
        assert set(np.asarray(owners).tolist()) == {subtask}
    assert by_subtask(frame.iloc[:0], "k", 128, 3) == []
