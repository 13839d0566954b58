"""Avro binary readers and writers compiled per event class: Python source generated from the
current schema and the event's dataclass, run through ``compile`` once per process.

Why not fastavro alone: fastavro decodes to dicts and encodes from dicts, so every event paid
for a dict and a conversion to or from the dataclass on top of fastavro's generic walk over the
schema. A round trip of an acknowledgement with 9 state handles ran at 8,500/s, a third of
json's rate. The compiled reader builds the dataclass straight from the bytes, with the common
cases (one-byte integers, the null branch of a union) inline. fastavro stays for what it does
best: reading older schema versions (schema resolution), and as the reference the tests hold
these functions to, byte for byte.

The subset of Avro the sparkpoint schemas use: records (also named and referred to again),
enums, arrays, maps, unions, string, boolean, int and long. Anything else is refused when the
codec starts, not when an event arrives.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[Any, bytearray], None]

_SMALL = [bytes([((v << 1) ^ (v >> 63)) & 0xFF]) for v in range(-64, 64)]
"""The one-byte zig-zag encodings of -64..63."""


def _write_long(value: int) -> bytes:
    if -64 <= value < 64:
        return _SMALL[value + 64]
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_long(data: bytes, pos: int, first: int) -> tuple[int, int]:
    """The rest of a varint whose first byte (already read, ``pos`` is past it) had the
    continuation bit."""
    n = first & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


class _Source:
    """Lines of generated Python and the objects they refer to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.functions: list[str] = []
        """Finished functions (a nested record's is finished before its parent's)."""
        self.env: dict[str, Any] = {
            "_read_long": _read_long,
            "_write_long": _write_long,
            "_SMALL": _SMALL,
            "_new": object.__new__,
        }
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def const(self, value: Any, prefix: str) -> str:
        name = self.name(prefix)
        self.env[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


class _Compiler:
    """Generates one reader and one writer per record type, named records once."""

    def __init__(self) -> None:
        self.src = _Source()
        self.records: dict[str, tuple[str, str]] = {}
        """Avro full name -> (reader function name, writer function name)."""

    def record(self, schema: dict[str, Any], cls: type, namespace: str) -> tuple[str, str]:
        full = _full_name(schema["name"], schema.get("namespace", namespace))
        if full in self.records:
            return self.records[full]
        names = (self.src.name("read_"), self.src.name("write_"))
        self.records[full] = names
        space = schema.get("namespace", namespace)
        hints = typing.get_type_hints(cls)
        by_name = {f.name: i for i, f in enumerate(fields(cls))}
        schema_fields = schema["fields"]
        if sorted(by_name) != sorted(f["name"] for f in schema_fields):
            raise ValueError(f"{cls.__name__} and schema {full} have different fields")
        saved = self.src.lines
        self.src.lines = [f"def {names[0]}(data, pos):"]
        for f in schema_fields:
            self._read(f["type"], hints[f["name"]], f"v{by_name[f['name']]}", 1, space)
        # The event, built without its __init__ (a frozen dataclass's sets each field through
        # object.__setattr__): object.__new__, then each slot's descriptor, half the cost.
        make = self.src.const(cls, "cls_")
        self.src.emit(1, f"obj = _new({make})")
        for i, f in enumerate(fields(cls)):
            setter = self.src.const(_setter(cls, f.name), "set_")
            self.src.emit(1, f"{setter}(obj, v{i})")
        self.src.emit(1, "return obj, pos")
        self.src.lines.append(f"def {names[1]}(obj, out):")
        for f in schema_fields:
            self._write(f["type"], hints[f["name"]], f"obj.{f['name']}", 1, space)
        self.src.emit(1, "return None")
        self.src.functions.append("\n".join(self.src.lines))
        self.src.lines = saved
        return names

    # --- reading --------------------------------------------------------------------------------

    def _emit_read_long(self, target: str, indent: int) -> None:
        """A zig-zag varint, the one- and two-byte cases inline (lengths up to 8,191 bytes,
        integers up to +-8,191)."""
        emit = self.src.emit
        emit(indent, "b = data[pos]; pos += 1")
        emit(indent, "if b < 128:")
        emit(indent + 1, f"{target} = (b >> 1) ^ -(b & 1)")
        emit(indent, "else:")
        emit(indent + 1, "c = data[pos]")
        emit(indent + 1, "if c < 128:")
        emit(indent + 2, "c = (b & 127) | (c << 7); pos += 1")
        emit(indent + 2, f"{target} = (c >> 1) ^ -(c & 1)")
        emit(indent + 1, "else:")
        emit(indent + 2, f"{target}, pos = _read_long(data, pos, b)")

    def _read(self, schema: Any, hint: Any, target: str, indent: int, namespace: str) -> None:
        emit = self.src.emit
        kind = _kind(schema, namespace, self.records)
        if kind == "union":
            inner = optional_inner(hint)
            emit(indent, "b = data[pos]; pos += 1")
            for i, branch in enumerate(schema):
                emit(indent, f"{'if' if i == 0 else 'elif'} b == {i * 2}:")
                if branch == "null":
                    emit(indent + 1, f"{target} = None")
                else:
                    self._read(branch, inner, target, indent + 1, namespace)
            emit(indent, "else:")
            emit(indent + 1, "raise ValueError(f'union branch {b} out of range')")
        elif kind == "null":
            emit(indent, f"{target} = None")
        elif kind == "boolean":
            emit(indent, "b = data[pos]; pos += 1")
            emit(indent, "if b > 1:")
            emit(indent + 1, "raise ValueError(f'boolean byte {b}')")
            emit(indent, f"{target} = b == 1")
        elif kind in ("int", "long"):
            self._emit_read_long(target, indent)
        elif kind == "string":
            self._emit_read_long("n", indent)
            emit(indent, "end = pos + n")
            emit(indent, "if n < 0 or end > len(data):")
            emit(indent + 1, "raise ValueError(f'string of {n} bytes at {pos}')")
            emit(indent, f"{target} = data[pos:end].decode(); pos = end")
        elif kind == "enum":
            members = self.src.const(tuple(hint[s] for s in schema["symbols"]), "enum_")
            self._emit_read_long("n", indent)
            emit(indent, "if n < 0:")
            emit(indent + 1, "raise ValueError(f'enum index {n}')")
            emit(indent, f"{target} = {members}[n]")
        elif kind in ("array", "map"):
            is_map = kind == "map"
            item_hint = typing.get_args(hint)[-1]
            items = self.src.name("items")
            emit(indent, f"{items} = {{}}" if is_map else f"{items} = []")
            emit(indent, "while True:")
            self._emit_read_long("count", indent + 1)
            emit(indent + 1, "if count == 0:")
            emit(indent + 2, "break")
            emit(indent + 1, "if count < 0:")
            emit(indent + 2, "count = -count")
            self._emit_read_long("size", indent + 2)
            loop = self.src.name("i")
            emit(indent + 1, f"for {loop} in range(count):")
            if is_map:
                key = self.src.name("key")  # its own name: a map's values may be maps
                self._read("string", str, key, indent + 2, namespace)
            item = self.src.name("item")
            self._read(
                schema["items" if not is_map else "values"], item_hint, item, indent + 2, namespace
            )
            emit(indent + 2, f"{items}[{key}] = {item}" if is_map else f"{items}.append({item})")
            emit(indent, f"{target} = {items}")
        elif kind == "record":
            reader, _ = self.record(schema, hint, namespace)
            emit(indent, f"{target}, pos = {reader}(data, pos)")
        elif kind == "named":
            reader, _ = self.records[_full_name(schema, namespace)]
            emit(indent, f"{target}, pos = {reader}(data, pos)")
        else:
            raise ValueError(f"Avro type {schema!r} is not supported by the compiled codec")

    # --- writing --------------------------------------------------------------------------------

    def _write(self, schema: Any, hint: Any, value: str, indent: int, namespace: str) -> None:
        emit = self.src.emit
        kind = _kind(schema, namespace, self.records)
        if kind == "union":
            inner = optional_inner(hint)
            null_at = schema.index("null")
            (other_at,) = [i for i in range(len(schema)) if i != null_at]
            local = self.src.name("u")
            emit(indent, f"{local} = {value}")
            emit(indent, f"if {local} is None:")
            emit(indent + 1, f"out.append({null_at * 2})")
            emit(indent, "else:")
            emit(indent + 1, f"out.append({other_at * 2})")
            self._write(schema[other_at], inner, local, indent + 1, namespace)
        elif kind == "null":
            pass
        elif kind == "boolean":
            emit(indent, f"out.append(1 if {value} else 0)")
        elif kind in ("int", "long"):
            local = self.src.name("n")
            emit(indent, f"{local} = {value}")
            emit(
                indent,
                f"out += _SMALL[{local} + 64] if -64 <= {local} < 64 else _write_long({local})",
            )
        elif kind == "string":
            local = self.src.name("s")
            emit(indent, f"{local} = {value}.encode()")
            emit(
                indent,
                f"out += _SMALL[len({local}) + 64] if len({local}) < 64 else _write_long(len({local}))",
            )
            emit(indent, f"out += {local}")
        elif kind == "enum":
            # by the member's name (an enum member's own hash is a Python-level call)
            index = self.src.const(
                {hint[s]._name_: _write_long(i) for i, s in enumerate(schema["symbols"])}, "index_"
            )
            emit(indent, f"out += {index}[{value}._name_]")
        elif kind in ("array", "map"):
            is_map = kind == "map"
            item_hint = typing.get_args(hint)[-1]
            local, item = self.src.name("c"), self.src.name("item")
            emit(indent, f"{local} = {value}")
            emit(indent, f"if {local}:")
            emit(indent + 1, f"out += _write_long(len({local}))")
            if is_map:
                key = self.src.name("key")
                emit(indent + 1, f"for {key}, {item} in {local}.items():")
                self._write("string", str, key, indent + 2, namespace)
            else:
                emit(indent + 1, f"for {item} in {local}:")
            self._write(
                schema["values" if is_map else "items"], item_hint, item, indent + 2, namespace
            )
            emit(indent, "out.append(0)")
        elif kind == "record":
            _, writer = self.record(schema, hint, namespace)
            emit(indent, f"{writer}({value}, out)")
        elif kind == "named":
            _, writer = self.records[_full_name(schema, namespace)]
            emit(indent, f"{writer}({value}, out)")
        else:
            raise ValueError(f"Avro type {schema!r} is not supported by the compiled codec")

    def build(self) -> dict[str, Any]:
        namespace = dict(self.src.env)
        exec(
            compile("\n".join(self.src.functions), "<sparkpoint avro codec>", "exec"), namespace
        )  # our own generated source
        return namespace


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """How the compiled reader sets field ``name`` of a new ``cls``: the slot's descriptor, or
    ``object.__setattr__`` for a class without slots."""
    descriptor = cls.__dict__.get(name)
    if descriptor is not None and hasattr(descriptor, "__set__"):
        setter: Callable[[Any, Any], None] = descriptor.__set__
        return setter
    return lambda obj, value: object.__setattr__(obj, name, value)


def _kind(schema: Any, namespace: str, records: dict[str, tuple[str, str]]) -> str:
    """What a schema node is: a primitive's name, ``record``, ``enum``, ``array``, ``map``,
    ``union`` (a list), or ``named`` (a reference to a record defined before)."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema.get("type"))
    if schema not in PRIMITIVES and _full_name(schema, namespace) in records:
        return "named"
    return str(schema)


PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def optional_inner(hint: Any) -> Any:
    """``X`` for a type hint ``X | None``; any other hint as it is."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner
    return hint


def compile_codec(schema: dict[str, Any], cls: type) -> tuple[Reader, Writer]:
    """(read, write) for one event class and its current schema (without logical types):
    ``read(body, 0)`` -> (event, offset after it), ``write(event, out)`` appends the body."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    compiler = _Compiler()
    reader, writer = compiler.record(schema, cls, schema.get("namespace", ""))
    built = compiler.build()
    return built[reader], built[writer]
