"""Avro single-object encoding of sparkpoint events, and the catalogue of schema versions.

Wire format (Avro specification, "Single-object encoding")::

    C3 01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's
          |   parsing canonical form | Avro binary body

The catalogue knows every schema version in ``schemas/*.avsc`` (current) and
``schemas/history/*.avsc`` (superseded). A reader looks the writer schema up by fingerprint and
resolves the body to the current schema of the same name, so old events stay readable after a
schema gains fields with defaults.

Timestamps are ``timestamp-millis`` in the schemas; the codec reads and writes them as epoch
milliseconds (the logical type is an annotation on a long: the bytes and the fingerprint are the
same either way), which is also what the domain events hold.
"""

from __future__ import annotations

import enum
import io
import json
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _avro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from sparkpoint.common.avro_compiled import Reader, Writer, compile_codec, optional_inner
from sparkpoint.common.events import EVENT_TYPES, Event

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8


class UndecodableEvent(ValueError):
    """Bytes that are not a sparkpoint event this process can read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def schema_dir() -> Path:
    """Where the ``.avsc`` files are: packaged inside ``sparkpoint`` (a wheel), or the
    repository's schemas/ (the package is services/sparkpoint/ there)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "schemas", package.parent.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no schemas directory beside {package}")


def fingerprint(schema: dict[str, Any]) -> bytes:
    """The 8 header bytes for a schema: CRC-64-AVRO of its parsing canonical form, little-endian."""
    canonical = to_parsing_canonical_form(fastavro.parse_schema(schema, named_schemas={}))
    return bytes.fromhex(_avro_fingerprint(canonical, "CRC-64-AVRO"))


def _without_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(v) for v in node]
    return node


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one event schema."""

    full_name: str
    fingerprint: bytes
    source: Path
    current: bool
    definition: dict[str, Any]
    parsed: Any  # fastavro's parsed schema, timestamps as plain longs

    @classmethod
    def from_file(cls, path: Path, current: bool) -> SchemaVersion:
        definition = json.loads(path.read_text())
        namespace = definition.get("namespace", "")
        name = definition["name"]
        full_name = name if "." in name else f"{namespace}.{name}"
        parsed = fastavro.parse_schema(_without_logical_types(definition), named_schemas={})
        return cls(full_name, fingerprint(definition), path, current, definition, parsed)


class SchemaCatalogue:
    """Every schema version this process knows, by full name and by fingerprint."""

    def __init__(self, versions: Iterable[SchemaVersion]) -> None:
        self._current: dict[str, SchemaVersion] = {}
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        for version in versions:
            if version.current:
                if version.full_name in self._current:
                    raise ValueError(f"two current schemas named {version.full_name}")
                self._current[version.full_name] = version
            self._by_fingerprint.setdefault(version.fingerprint, version)
        for version in self._by_fingerprint.values():
            if version.full_name not in self._current:
                raise ValueError(f"{version.source} has no current schema {version.full_name}")

    @classmethod
    def load(cls, directory: Path | None = None) -> SchemaCatalogue:
        root = directory or schema_dir()
        current = [SchemaVersion.from_file(p, True) for p in sorted(root.glob("*.avsc"))]
        history = [SchemaVersion.from_file(p, False) for p in sorted(root.glob("history/*.avsc"))]
        return cls(current + history)

    def current(self, full_name: str) -> SchemaVersion:
        try:
            return self._current[full_name]
        except KeyError:
            raise KeyError(f"no schema named {full_name}") from None

    def by_fingerprint(self, fp: bytes) -> SchemaVersion | None:
        return self._by_fingerprint.get(fp)

    def versions(self) -> list[SchemaVersion]:
        return list(self._by_fingerprint.values())

    def names(self) -> list[str]:
        return sorted(self._current)


# --- dataclass <-> Avro record, compiled once per event class ---------------------------------

Convert = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _converters(hint: Any) -> tuple[Convert, Convert]:
    """(to_avro, from_avro) for one field type."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        to_avro, from_avro = _converters(optional_inner(hint))
        if to_avro is _identity:
            return _identity, _identity
        return (
            lambda v: None if v is None else to_avro(v),
            lambda v: None if v is None else from_avro(v),
        )
    if origin is list:
        (item,) = typing.get_args(hint)
        to_avro, from_avro = _converters(item)
        if to_avro is _identity:
            return list, list
        return (lambda v: [to_avro(x) for x in v], lambda v: [from_avro(x) for x in v])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        members = hint.__members__
        return (lambda v: v.name, members.__getitem__)
    if isinstance(hint, type) and is_dataclass(hint):
        record = _RecordConverter(hint)
        return record.to_avro, record.from_avro
    return _identity, _identity


class _RecordConverter:
    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.field_names = [f.name for f in fields(cls)]
        pairs = [_converters(hints[name]) for name in self.field_names]
        self._to = [(name, to) for name, (to, _) in zip(self.field_names, pairs, strict=True)]
        self._from = [(name, back) for name, (_, back) in zip(self.field_names, pairs, strict=True)]

    def to_avro(self, obj: Any) -> dict[str, Any]:
        return {name: to(getattr(obj, name)) for name, to in self._to}

    def from_avro(self, record: dict[str, Any]) -> Any:
        return self.cls(**{name: back(record[name]) for name, back in self._from})


def _field_names(schema: dict[str, Any]) -> list[str]:
    return [f["name"] for f in schema["fields"]]


class EventCodec:
    """Encodes events to single-object Avro and decodes any known version back to events."""

    def __init__(self, catalogue: SchemaCatalogue | None = None) -> None:
        self.catalogue = catalogue or SchemaCatalogue.load()
        self._by_class: dict[type, tuple[bytes, Writer]] = {}
        self._by_name: dict[str, _RecordConverter] = {}
        self._compiled: dict[bytes, tuple[str, Reader]] = {}
        """Current schema fingerprint -> its compiled reader (older versions go via fastavro)."""
        for cls in EVENT_TYPES:
            schema = self.catalogue.current(cls.SCHEMA)
            converter = _RecordConverter(cls)
            if sorted(converter.field_names) != sorted(_field_names(schema.definition)):
                raise ValueError(
                    f"{cls.__name__} fields {sorted(converter.field_names)} do not match "
                    f"{schema.source.name} fields {sorted(_field_names(schema.definition))}"
                )
            read, write = compile_codec(_without_logical_types(schema.definition), cls)
            self._by_class[cls] = (MAGIC + schema.fingerprint, write)
            self._compiled[schema.fingerprint] = (schema.full_name, read)
            self._by_name[cls.SCHEMA] = converter

    def encode(self, event: Event) -> bytes:
        try:
            header, write = self._by_class[type(event)]
        except KeyError:
            raise TypeError(f"{type(event).__name__} is not a sparkpoint event") from None
        out = bytearray(header)
        try:
            write(event, out)
        except (AttributeError, KeyError, TypeError) as exc:
            raise TypeError(f"{type(event).__name__} cannot be encoded: {exc!r}") from exc
        return bytes(out)

    def decode(self, data: bytes) -> Event:
        if type(data) is not bytes:
            self._check_header(data)
            data = bytes(data)
        if data[:2] == MAGIC:
            compiled = self._compiled.get(data[2:HEADER_SIZE])
            if compiled is not None:  # the current schema of a known event (a 10-byte header)
                name, read = compiled
                try:
                    current, end = read(data, HEADER_SIZE)
                except (IndexError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                    raise UndecodableEvent(f"{name}: truncated or corrupt body ({exc!r})") from exc
                if end != len(data):
                    raise UndecodableEvent(f"{name}: {len(data) - end} bytes after the body")
                return current  # type: ignore[no-any-return]
        writer, body = self._split(data)
        reader = self.catalogue.current(writer.full_name)
        record = self._read(writer, reader, body)
        try:
            event: Event = self._by_name[reader.full_name].from_avro(record)
        except (KeyError, TypeError, ValueError) as exc:
            raise UndecodableEvent(f"{writer.full_name}: {exc}") from exc
        return event

    @staticmethod
    def _check_header(data: bytes) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise UndecodableEvent(f"expected bytes, got {type(data).__name__}")
        if len(data) < HEADER_SIZE:
            raise UndecodableEvent(f"{len(data)} bytes is shorter than the 10-byte header")
        if data[:2] != MAGIC:
            raise UndecodableEvent(
                f"no single-object marker C3 01 (starts with {bytes(data[:2]).hex()})"
            )

    def _split(self, data: bytes) -> tuple[SchemaVersion, io.BytesIO]:
        self._check_header(data)
        fp = bytes(data[2:HEADER_SIZE])
        writer = self.catalogue.by_fingerprint(fp)
        if writer is None:
            raise UndecodableEvent(f"unknown schema fingerprint {fp.hex()}")
        return writer, io.BytesIO(data[HEADER_SIZE:])

    @staticmethod
    def _read(writer: SchemaVersion, reader: SchemaVersion, body: io.BytesIO) -> dict[str, Any]:
        resolve_to = None if writer is reader else reader.parsed
        try:
            record = fastavro.schemaless_reader(body, writer.parsed, resolve_to)
        except Exception as exc:  # fastavro raises EOFError, IndexError, ValueError... on bad bytes
            raise UndecodableEvent(
                f"{writer.full_name}: truncated or corrupt body ({exc!r})"
            ) from exc
        remaining = len(body.getbuffer()) - body.tell()
        if remaining:
            raise UndecodableEvent(f"{writer.full_name}: {remaining} bytes after the body")
        if not isinstance(record, dict):
            raise UndecodableEvent(f"{writer.full_name}: body is not a record")
        return record
