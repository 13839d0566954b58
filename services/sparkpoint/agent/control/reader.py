"""The job's control partition read on a thread of its own while the job runs, so the loop can
sleep between turns (`agent.wakeup`) and still answer a trigger as soon as it is fetched: the
thread blocks in the consumer, keeps what arrived in order, and wakes the loop.

The loop takes what arrived (`take`) and judges it as before (`Membership.hears`, on the loop's
thread). Nothing read is lost when the link lets go: `stop` returns what was read and not yet
taken, and a restart in the same process reads on from the first of those."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from sparkpoint.common.kafka import EventSubscriber, Received

READ_WAIT_S = 0.2
"""How long one read blocks in the consumer when nothing arrives (it returns at the first
record); it bounds how long `stop` takes."""


class ControlReader:
    def __init__(self, control: EventSubscriber, wake: Callable[[], None], batch: int) -> None:
        self.control = control
        self.wake = wake
        self.batch = batch
        self.arrived: deque[Received] = deque()
        self.failure: BaseException | None = None
        """What ended the reading (a fatal consumer error): raised to the loop by `take`."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._read, name="control-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._stopping.is_set():
                records = self.control.poll(READ_WAIT_S, self.batch)
                if records:
                    self.arrived.extend(records)
                    self.wake()
        except BaseException as exc:  # the loop's thread raises it
            self.failure = exc
            self.wake()

    def take(self, most: int) -> list[Received]:
        """Up to ``most`` records in the order they were read; raises what ended the reading
        once they are all taken."""
        records: list[Received] = []
        while self.arrived and len(records) < most:
            records.append(self.arrived.popleft())
        if not records and self.failure is not None:
            raise self.failure
        return records

    def stop(self) -> list[Received]:
        """Ends the reading (within `READ_WAIT_S`); returns what was read and not taken."""
        self._stopping.set()
        self._thread.join()
        left, self.arrived = list(self.arrived), deque()
        return left
