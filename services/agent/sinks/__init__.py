"""Sinks: where stage 2's output goes. Stage 2 stages each round's output as an Arrow file; a
sink either publishes it right away (at-least-once) or when the checkpoint of its epoch completes
(exactly-once), idempotently, so a restore can publish a completed epoch again."""

from __future__ import annotations

from typing import Protocol

import pandas as pd

from services.agent.stages import from_ipc


class SinkWriter(Protocol):
    exactly_once: bool

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        """Makes epoch ``epoch``'s staged output visible (exactly-once: atomically, once)."""
        ...

    def write_now(self, outputs: list[str]) -> int:
        """At-least-once: makes the output visible at once."""
        ...

    def published_epoch(self) -> int:
        """The newest epoch already visible (0: none); epochs are published in order."""
        ...

    def close(self) -> None: ...


def read_outputs(outputs: list[str]) -> pd.DataFrame:
    frames = [from_ipc(path) for path in outputs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
