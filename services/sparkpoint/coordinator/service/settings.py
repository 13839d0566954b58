"""What one coordinator instance is told at start (``sparkpoint coordinator``'s options)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sparkpoint.common.settings import CheckpointConfig


@dataclass
class ServiceSettings:
    bootstrap: str
    defaults: CheckpointConfig = field(default_factory=CheckpointConfig)
    instance_id: str = field(default_factory=lambda: f"coordinator-{uuid.uuid4().hex[:8]}")
    rest_url: str = ""
    history_url: str | None = None
    """The history service (`sparkpoint history`): checkpoint statistics from before this
    instance owned a job are added from it (`sparkpoint.coordinator.service.earlier`)."""
    transactions_in_flight: int = 1
    """How many of this instance's partition writers may have a transaction open at once
    (`sparkpoint.coordinator.service.writer.TransactionTurns`)."""

    def roots(self) -> list[str]:
        """The storage roots: every path the coordinator writes or deletes lies inside one."""
        return [self.defaults.checkpoint_dir, self.defaults.savepoint_dir]
