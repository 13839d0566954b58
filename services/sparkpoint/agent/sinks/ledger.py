"""The exactly-once sink's epochs on their way to being visible (Flink keeps committables the
same way until they are committed): output staged since the last barrier (unsealed), epochs a
snapshot sealed whose checkpoint has not completed (sealed), and epochs handed to the committer
that it has not published yet (committing). A snapshot names every epoch not yet visible; a
completion commits the epochs it covers; an abort folds its epoch into the next one.

A sink that writes ahead (`SinkWriter.writes_ahead`) gets the oldest epoch's output as it is
staged (`EpochCommitter.write_ahead`), so a completion only commits: only that epoch's, since a
transaction that held a later epoch's output would make it visible with the earlier checkpoint
(a restore from that checkpoint would then produce it again)."""

from __future__ import annotations

import logging

from fsspec.core import url_to_fs

from sparkpoint.agent.sinks import EpochCommitter, SinkWriter, unpublished

log = logging.getLogger(__name__)

Outputs = list[tuple[int, str]]
"""(keyed subtask, staged output file) of an epoch."""


class EpochLedger:
    def __init__(self, job_id: str, sink: SinkWriter, committer: EpochCommitter) -> None:
        self.job_id = job_id
        self.sink = sink
        self.committer = committer
        self.unsealed: Outputs = []
        """Output staged since the last barrier: the next epoch's."""
        self.sealed: dict[int, Outputs] = {}
        """Epoch -> its staged output, for epochs whose checkpoint has not completed."""
        self.committing: dict[int, Outputs] = {}
        """Epochs handed to the committer and not yet published: snapshots still name them."""
        self.ahead: set[str] = set()
        """Staged files written ahead into the open transaction, their epoch not submitted."""

    def stage(self, outputs: Outputs) -> None:
        self.unsealed.extend(outputs)
        self._write_ahead()

    def seal(self, checkpoint_id: int) -> None:
        """A snapshot of ``checkpoint_id``: everything staged so far is its epoch."""
        self.sealed[checkpoint_id] = self.unsealed
        self.unsealed = []

    def unpublished(self) -> dict[int, Outputs]:
        """Epochs whose output is not visible yet: sealed ones, and those handed to the
        committer that it has not published. A snapshot names both: a checkpoint completing
        while an earlier epoch is still being published must not lose that epoch if it is
        restored."""
        done = self.committer.published_through
        for epoch in [e for e in self.committing if e <= done]:
            del self.committing[epoch]
        return {**self.committing, **self.sealed}

    def commit_through(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its epoch and every earlier one sealed are
        published, in order, by the committer."""
        for epoch in sorted(e for e in self.sealed if e <= checkpoint_id):
            outputs = self.sealed.pop(epoch)
            if outputs:
                self.committing[epoch] = outputs
                paths = [path for _, path in outputs]
                self.committer.submit(epoch, paths)
                self.ahead.difference_update(paths)
        self._write_ahead()

    def fold(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: its epoch's output joins the next epoch."""
        outputs = self.sealed.pop(checkpoint_id, None)
        if not outputs:
            return
        later = sorted(e for e in self.sealed if e > checkpoint_id)
        if later:
            self.sealed[later[0]] = outputs + self.sealed[later[0]]
        else:
            self.unsealed = outputs + self.unsealed
        self._write_ahead()

    def _write_ahead(self) -> None:
        """The oldest epoch's output not written ahead yet goes to the open transaction: the
        oldest sealed epoch's, or (none sealed) what was staged since the last barrier."""
        if not self.committer.writes_ahead:
            return
        oldest = self.sealed[min(self.sealed)] if self.sealed else self.unsealed
        fresh = [path for _, path in oldest if path not in self.ahead]
        if fresh:
            self.ahead.update(fresh)
            self.committer.write_ahead(fresh)

    def staged_outputs(self) -> list[str]:
        """Staged output files not yet published, oldest epoch first."""
        staged = [o for epoch in sorted(self.sealed) for o in self.sealed[epoch]] + self.unsealed
        return [path for _, path in staged]

    def publish_restored(self, epochs: dict[int, list[str]], checkpoint_id: int) -> None:
        """Epochs <= the restored checkpoint completed; publishes those the sink has not."""
        if not epochs or not self.sink.exactly_once:
            return
        published = self.sink.published()
        if published is not None and published.epoch > checkpoint_id:
            log.warning(
                "job %s: the sink already published epoch %d, after the restored checkpoint %d: "
                "output after that checkpoint is produced again (an older snapshot was restored)",
                self.job_id, published.epoch, checkpoint_id,
            )  # fmt: skip
        log.info("job %s: the sink's newest published epoch: %s", self.job_id, published)
        for epoch in unpublished(epochs, published):
            outputs = epochs[epoch]
            if not all_exist(outputs):
                # staged files go only once their epoch is visible (the committer deletes them
                # after publishing; a later run cleans up only after publishing what it restored)
                log.info(
                    "job %s: epoch %d was published (its staged files are gone)", self.job_id, epoch
                )
                continue
            log.info(
                "job %s: epoch %d completed but is not published: publishing", self.job_id, epoch
            )
            self.committer.submit(epoch, outputs, delete=False)
        self.committer.drain()


def all_exist(paths: list[str]) -> bool:
    for path in paths:
        fs, target = url_to_fs(path)
        if not fs.exists(target):
            return False
    return True
