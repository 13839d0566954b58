"""Value formats against the reference implementation: Avro written by the ``avro`` package
decodes with ours, ours decodes with the ``avro`` package, in both framings (single-object and
the Confluent wire format); bad values are reported by offset and skipped, the rest kept in
source order. Schemas are real ``.avsc`` files (tests/data)."""

from __future__ import annotations

import io
import json
import random
import struct
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pandas as pd
import pytest

from sparkpoint.agent.formats import (
    AvroValues,
    ConfluentAvroValues,
    JsonValues,
    RawValues,
    StringValues,
    plain_json_lines,
)

DATA = Path(__file__).resolve().parents[1] / "data"
V1, V2, STAT = (str(DATA / name) for name in ("payment-v1.avsc", "payment-v2.avsc", "stat.avsc"))


def reference_schema(path: str) -> avro.schema.Schema:
    return avro.schema.parse(Path(path).read_text())


def reference_body(path: str, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    avro.io.DatumWriter(reference_schema(path)).write(record, avro.io.BinaryEncoder(out))
    return out.getvalue()


def reference_read(path: str, body: bytes) -> Any:
    schema = reference_schema(path)
    return avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(body)))


def single_object(path: str, record: dict[str, Any]) -> bytes:
    """The Avro spec's single-object encoding, built from the avro package's own parts."""
    fingerprint = reference_schema(path).fingerprint("CRC-64-AVRO")
    return b"\xc3\x01" + fingerprint + reference_body(path, record)


def confluent(schema_id: int, path: str, record: dict[str, Any]) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + reference_body(path, record)


def payment(i: int, currency: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"id": i, "account": f"acct-{i % 7}", "amount": i * 10, "ts": 1000 + i}
    if currency is not None:
        record["currency"] = currency
    return record


def decode(fmt: Any, values: list[bytes]) -> tuple[pd.DataFrame, list[tuple[int, str]]]:
    offsets = list(range(100, 100 + len(values)))
    frame, bad = fmt.decode(values, [b"k"] * len(values), offsets)
    return frame, bad


# --- Avro single-object ---------------------------------------------------------------------------


def test_single_object_values_of_the_avro_package_decode_in_one_batch() -> None:
    values = [single_object(V1, payment(i)) for i in range(1000)]

    frame, bad = decode(AvroValues(V1), values)

    assert bad == []
    assert frame.to_dict(orient="records") == [payment(i) for i in range(1000)]


def test_our_single_object_values_decode_with_the_avro_package() -> None:
    records = [payment(i) for i in range(50)]

    values = AvroValues(V1).encode(pd.DataFrame(records))

    fingerprint = reference_schema(V1).fingerprint("CRC-64-AVRO")
    assert all(v[:10] == b"\xc3\x01" + fingerprint for v in values)
    assert [reference_read(V1, v[10:]) for v in values] == records


def test_bad_single_object_values_are_reported_by_offset_and_the_rest_kept_in_order() -> None:
    other = single_object(V2, payment(1, "EUR"))  # another schema's fingerprint
    truncated = single_object(V1, payment(2))[:-3]
    values = [
        single_object(V1, payment(0)),
        b'{"id": 1}',
        other,
        truncated,
        single_object(V1, payment(4)),
    ]

    frame, bad = decode(AvroValues(V1), values)

    assert frame["id"].tolist() == [0, 4]
    assert [offset for offset, _ in bad] == [101, 102, 103]
    reasons = dict(bad)
    assert "marker" in reasons[101] and "fingerprint" in reasons[102]


# --- Confluent wire format ------------------------------------------------------------------------


def test_confluent_values_of_two_schema_ids_decode_in_source_order() -> None:
    values = [
        confluent(1, V1, payment(i)) if i % 3 else confluent(2, V2, payment(i, "EUR"))
        for i in range(300)
    ]

    frame, bad = decode(ConfluentAvroValues(schemas={1: V1, 2: V2}), values)

    assert bad == []
    assert frame["id"].tolist() == list(range(300))
    currencies = frame["currency"].tolist()
    assert currencies[0] == "EUR" and pd.isna(currencies[1])


def test_our_confluent_values_decode_with_the_avro_package() -> None:
    records = [payment(i) for i in range(20)]
    fmt = ConfluentAvroValues(schema=V1, schema_id=42)

    values = fmt.encode(pd.DataFrame(records))

    assert all(v[:5] == b"\x00" + struct.pack(">I", 42) for v in values)
    assert [reference_read(V1, v[5:]) for v in values] == records
    frame, bad = decode(ConfluentAvroValues(schemas={42: V1}), values)
    assert bad == [] and frame.to_dict(orient="records") == records


def test_unknown_schema_ids_and_bad_frames_are_reported_and_skipped() -> None:
    values = [
        confluent(1, V1, payment(0)),
        confluent(9, V1, payment(1)),  # no schema 9
        b"\x01\x00\x00\x00\x01xyz",  # wrong magic byte
        b"\x00\x00",  # too short
        confluent(1, V1, payment(4)) + b"\x00\x00",  # trailing bytes
        confluent(1, V1, payment(5)),
    ]

    frame, bad = decode(ConfluentAvroValues(schemas={1: V1}), values)

    assert frame["id"].tolist() == [0, 5]
    assert [offset for offset, _ in bad] == [101, 102, 103, 104]
    assert "schema 9" in dict(bad)[101]


def test_a_confluent_sink_needs_a_schema_and_an_id_or_registry() -> None:
    frame = pd.DataFrame([payment(0)])
    with pytest.raises(ValueError, match="schema"):
        ConfluentAvroValues().encode(frame)
    with pytest.raises(ValueError, match="schema_id or a registry"):
        ConfluentAvroValues(schema=V1).encode(frame)


# --- JSON, raw, strings ---------------------------------------------------------------------------


def test_json_values_decode_in_bulk_and_bad_ones_are_reported() -> None:
    values = [json.dumps(payment(i)).encode() for i in range(3)]
    values.insert(1, b"[1, 2]")
    values.insert(3, b"{not json")

    frame, bad = decode(JsonValues(), values)

    assert frame["id"].tolist() == [0, 1, 2]
    assert [offset for offset, _ in bad] == [101, 103]
    assert JsonValues().encode(frame.head(1)) == [json.dumps(payment(0)).replace(" ", "").encode()]


def test_json_values_encode_one_value_per_row_whatever_the_strings_hold() -> None:
    """Newlines, line and paragraph separators and control characters inside strings stay
    inside their value; an empty frame encodes to no values."""
    texts = ["a\nb", "c\r\nd", "e\u2028f\u2029g", "h\x1ci\x85j", "", "ü"]
    frame = pd.DataFrame({"text": texts, "n": range(len(texts))})

    values = JsonValues().encode(frame)

    assert [json.loads(v) for v in values] == [{"text": t, "n": n} for n, t in enumerate(texts)]
    assert JsonValues().encode(frame.head(0)) == []


def test_raw_and_string_values_keep_keys_and_report_bad_text() -> None:
    values = [b"\x00\xff", "héllo".encode()]

    raw, raw_bad = decode(RawValues(), values)
    text, text_bad = decode(StringValues(), values)

    assert raw_bad == [] and raw["value"].tolist() == values and raw["key"].tolist() == ["k", "k"]
    assert text["value"].tolist() == ["héllo"] and [o for o, _ in text_bad] == [100]
    assert RawValues().encode(raw) == values and StringValues().encode(text) == [values[1]]


# --- random records, against the references ----------------------------------------------------

LONGS = (0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63))
ALPHABET = 'abcxyz09 _-"\\/\n\t\u2028é€𝄞\x00\x1f'


def random_payment(rng: random.Random, with_currency: bool) -> dict[str, Any]:
    def long() -> int:
        return rng.choice(LONGS) if rng.random() < 0.2 else rng.randrange(-(10**12), 10**12)

    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))
    record: dict[str, Any] = {"id": long(), "account": text, "amount": long(), "ts": long()}
    if with_currency:
        record["currency"] = rng.choice([None, "EUR", text])
    return record


def malformed(rng: random.Random, good: bytes) -> bytes:
    """A value that must not decode: cut short, or a byte of its header changed."""
    if rng.random() < 0.5:
        return good[: rng.randrange(0, 3)]
    return bytes([good[0] ^ 0xFF]) + good[1:]


@pytest.mark.parametrize("seed", range(8))
def test_random_avro_records_round_trip_with_the_avro_package_bad_ones_reported(
    seed: int,
) -> None:
    rng = random.Random(seed)
    records = [random_payment(rng, with_currency=False) for _ in range(300)]
    ours = AvroValues(V1)
    # the avro package's values decode with ours, malformed ones among them reported by offset
    values = [single_object(V1, r) for r in records]
    bad_at = sorted(rng.sample(range(len(values)), 7))
    for i in bad_at:
        values[i] = malformed(rng, values[i])
    frame, bad = decode(ours, values)
    assert [offset for offset, _ in bad] == [100 + i for i in bad_at]
    kept = [r for i, r in enumerate(records) if i not in bad_at]
    assert frame.to_dict(orient="records") == kept
    # ours decode with the avro package, in both framings
    assert [reference_read(V1, v[10:]) for v in ours.encode(pd.DataFrame(records))] == records
    confluent_ours = ConfluentAvroValues(schema=V1, schema_id=7)
    encoded = confluent_ours.encode(pd.DataFrame(records))
    assert [reference_read(V1, v[5:]) for v in encoded] == records


@pytest.mark.parametrize("seed", range(8))
def test_random_json_records_round_trip_with_the_json_module_bad_ones_reported(
    seed: int,
) -> None:
    rng = random.Random(seed)
    records = [random_payment(rng, with_currency=True) for _ in range(300)]
    for record in records:  # a null comes back as None or NaN by the column's type: no nulls here
        record["currency"] = record["currency"] or "none"
    values = [json.dumps(r).encode() for r in records]
    bad_at = sorted(rng.sample(range(len(values)), 5))
    for i in bad_at:
        values[i] = rng.choice([b"{not json", b"[1, 2]", b'"text"', values[i][:-1]])
    frame, bad = decode(JsonValues(), values)
    assert [offset for offset, _ in bad] == [100 + i for i in bad_at]
    kept = [r for i, r in enumerate(records) if i not in bad_at]
    assert frame.to_dict(orient="records") == kept
    assert [json.loads(v) for v in JsonValues().encode(pd.DataFrame(records))] == records


SAFE = "abcxyz09 _-.:{}[],AZ~"
"""Characters pandas' JSON writer writes as they are."""


@pytest.mark.parametrize("seed", range(6))
def test_json_values_write_the_bytes_pandas_writes_whether_or_not_arrow_puts_them_together(
    seed: int,
) -> None:
    """Random frames of integers, booleans and strings: those whose strings need no escape and
    hold no null are put together by Arrow (`plain_json_lines`), the others written by pandas;
    both give exactly the bytes of ``to_json(orient="records", lines=True)``, one per row."""
    rng = random.Random(seed)
    for _ in range(20):
        rows = rng.randrange(1, 60)
        escapes = rng.random() < 0.4
        alphabet = SAFE + ('"\\/\n\x00é€𝄞' if escapes else "")
        frame = pd.DataFrame(
            {
                "user": ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9))) for _ in range(rows)],
                "sum": pd.array([rng.choice(LONGS) for _ in range(rows)], dtype="int64"),
                "small": pd.array([rng.randrange(-128, 128) for _ in range(rows)], dtype="int8"),
                "big": pd.array([rng.choice([0, 2**64 - 1]) for _ in range(rows)], dtype="uint64"),
                "flag": [rng.random() < 0.5 for _ in range(rows)],
            }
        )  # fmt: skip
        expected = frame.to_json(orient="records", lines=True).rstrip("\n").encode().split(b"\n")
        plain = plain_json_lines(frame)
        needs_escape = any(c not in SAFE for text in frame["user"] for c in text)
        assert (plain is None) == needs_escape
        assert JsonValues().encode(frame) == expected
        assert [json.loads(v) for v in expected] == frame.to_dict(orient="records")


def test_json_values_leave_nulls_floats_and_other_types_to_pandas() -> None:
    for frame in (
        pd.DataFrame({"n": pd.array([1, None], dtype="Int64")}),
        pd.DataFrame({"s": ["a", None]}),
        pd.DataFrame({"x": [0.1, 2.5]}),
        pd.DataFrame({"t": pd.to_datetime(["2026-11-29"])}),
        pd.DataFrame({"a/b": [1]}),
        pd.DataFrame([[1, 2]], columns=["a", "a"]),
        pd.DataFrame({"big": [2**70, 1]}),
        pd.DataFrame({"b": [b"x"]}),
        pd.DataFrame({"c": pd.Categorical(["a", "b"])}),
    ):
        assert plain_json_lines(frame) is None
    assert JsonValues().encode(pd.DataFrame({"x": [0.1, 2.5]})) == [b'{"x":0.1}', b'{"x":2.5}']
