"""The file sink: Parquet part files under a directory (any fsspec URL).

Exactly-once, as Flink's FileSink: a part file is written hidden (``.part-...inprogress``) and
renamed to its final name when the checkpoint of its epoch completes. On an object store (S3 and
the like), which has no rename, it is written once under its final name when the checkpoint of
its epoch completes: a PUT (or a completed multipart upload) makes the object appear whole or
not at all. A final name is the epoch
and the name of the staged file it comes from (``part-<epoch>-r<round>-s<subtask>-<token>.parquet``,
the token random per agent run): publishing an epoch again after a restore skips the files
already committed and commits the rest, and no later run of the job can overwrite a committed
file. Readers (Spark, pyarrow) ignore hidden files.

Part files are written by Spark tasks (`commit_part`, a task per staged file, run by the agent's
`SinkRunner`): output never passes through the driver, and the directory must be one every
executor reaches.
"""

from __future__ import annotations

import io
import logging
import posixpath
import uuid
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from sparkpoint.agent.job import DeliveryGuarantee, FileSink
from sparkpoint.agent.sinks import Emit, PublishedEpoch, SinkRunner, inline, read_outputs
from sparkpoint.common.storage import is_object_store, put_whole

log = logging.getLogger(__name__)


def part_name(epoch: int, staged: str) -> str:
    """The committed name of a staged file: unique to the run that staged it."""
    stem = posixpath.basename(staged).removesuffix(".arrow").removeprefix("out-")
    return f"part-{epoch:010d}-{stem}.parquet"


@dataclass(frozen=True)
class Part:
    """One part file to commit, for one Spark task: only names travel."""

    directory: str
    """The sink's directory (a path or URL every executor reaches)."""
    name: str
    staged: tuple[str, ...]


def commit_part(part: Part) -> int:
    """Writes a part file from staged output, whole or not at all; 0 when it was committed
    before (a restore publishes an epoch again). Runs inside a Spark task."""
    fs, root = url_to_fs(part.directory)
    final = posixpath.join(root, part.name)
    if fs.exists(final):
        return 0  # committed before a restore
    return write_part(part.directory, part.name, read_outputs(list(part.staged)))


@dataclass(frozen=True)
class DirectPart:
    """At-least-once: a stage-2 task writes its round's output as a part file at once."""

    directory: str

    def __call__(self, frame: pd.DataFrame) -> int:
        return write_part(self.directory, f"part-{uuid.uuid4().hex}.parquet", frame)


def write_part(directory: str, name: str, frame: pd.DataFrame) -> int:
    """Writes ``frame`` as the part file ``name``, whole or not at all; returns its rows."""
    if not len(frame):
        return 0
    fs, root = url_to_fs(directory)
    final = posixpath.join(root, name)
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    if is_object_store(fs):
        put_whole(fs, final, buffer.getvalue())  # one PUT: whole or absent
        return len(frame)
    hidden = posixpath.join(root, f".{name}.inprogress-{uuid.uuid4().hex[:8]}")
    with fs.open(hidden, "wb") as out:
        out.write(buffer.getvalue())
    fs.mv(hidden, final)
    return len(frame)


class FileSinkWriter:
    def __init__(self, sink: FileSink, job_id: str, run: SinkRunner = inline) -> None:
        self.sink = sink
        self.job_id = job_id
        self.exactly_once = sink.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
        self.writes_ahead = False
        """A part file appears by a rename when its epoch commits: nothing to write ahead."""
        self.run = run
        fs, root = url_to_fs(sink.directory)
        fs.makedirs(root, exist_ok=True)

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        """One part file per staged file, written by a task each (in parallel)."""
        parts = [Part(self.sink.directory, part_name(epoch, o), (o,)) for o in outputs]
        return sum(self.run(commit_part, parts))

    def prepare(self) -> None:
        pass

    def write_ahead(self, outputs: list[str]) -> None:
        raise RuntimeError("a file sink does not write ahead")

    def abort_ahead(self) -> None:
        pass

    def direct(self) -> Emit | None:
        return None if self.exactly_once else DirectPart(self.sink.directory)

    def published(self) -> PublishedEpoch | None:
        return None  # committed files prove themselves by name: each one is checked

    def close(self) -> None:
        pass
