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
"""

from __future__ import annotations

import io
import logging
import posixpath
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from services.agent.job import DeliveryGuarantee, FileSink
from services.agent.sinks import PublishedEpoch, read_outputs
from services.common.storage import is_object_store, put_whole

log = logging.getLogger(__name__)


def part_name(epoch: int, staged: str) -> str:
    """The committed name of a staged file: unique to the run that staged it."""
    stem = posixpath.basename(staged).removesuffix(".arrow").removeprefix("out-")
    return f"part-{epoch:010d}-{stem}.parquet"


class FileSinkWriter:
    def __init__(self, sink: FileSink, job_id: str) -> None:
        self.sink = sink
        self.job_id = job_id
        self.exactly_once = sink.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
        self.fs, self.root = url_to_fs(sink.directory)
        self.fs.makedirs(self.root, exist_ok=True)

    def _commit(self, name: str, outputs: list[str]) -> int:
        final = posixpath.join(self.root, name)
        if self.fs.exists(final):
            return 0  # committed before a restore
        frame = read_outputs(outputs)
        if not len(frame):
            return 0
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
        if is_object_store(self.fs):
            put_whole(self.fs, final, buffer.getvalue())  # one PUT: whole or absent
            return len(frame)
        hidden = posixpath.join(self.root, f".{name}.inprogress-{uuid.uuid4().hex[:8]}")
        with self.fs.open(hidden, "wb") as out:
            out.write(buffer.getvalue())
        self.fs.mv(hidden, final)
        return len(frame)

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        count = 0
        for output in outputs:
            count += self._commit(part_name(epoch, output), [output])
        return count

    def write_now(self, outputs: list[str]) -> int:
        return self._commit(f"part-{uuid.uuid4().hex}.parquet", outputs)

    def published(self) -> PublishedEpoch | None:
        return None  # committed files prove themselves by name: each one is checked

    def close(self) -> None:
        pass
