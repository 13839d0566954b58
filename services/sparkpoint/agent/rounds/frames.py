"""Arrow frames between the stages: records cross from stage 1 to stage 2, and into sinks, as
Arrow IPC streams (in segment files, or in memory); every frame carries its key group."""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc

from sparkpoint.agent.state.backend import read_file

KEY_GROUP_COLUMN = "_key_group"


def to_ipc(frame: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(payload: bytes | str) -> pd.DataFrame:
    data = read_file(payload) if isinstance(payload, str) else payload
    return ipc.open_stream(pa.BufferReader(data)).read_all().to_pandas()
