"""The exactly-once ledger writing ahead: which staged output goes into the sink's open
transaction before its checkpoint completes. Pure logic: a committer that keeps the transaction
as the write-ahead process does (`sinks.ahead.OpenTransaction` refuses a commit whose
transaction holds files of another epoch)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from sparkpoint.agent.sinks.ledger import EpochLedger


@dataclass
class Transactional:
    """A committer of a sink that writes ahead, with its one open transaction."""

    writes_ahead: bool = True
    open: list[str] = field(default_factory=list)
    commits: list[tuple[int, list[str]]] = field(default_factory=list)
    ahead: int = 0
    published_through: int = 0

    def write_ahead(self, outputs: list[str]) -> None:
        assert self.writes_ahead
        self.ahead += len(outputs)
        self.open.extend(outputs)

    def submit(self, epoch: int, outputs: list[str], delete: bool = True) -> None:
        beyond = set(self.open) - set(outputs)
        assert not beyond, f"epoch {epoch}'s commit would publish {sorted(beyond)}"
        assert len(set(self.open)) == len(self.open), "a file written ahead twice"
        self.commits.append((epoch, outputs))
        self.open = []


def ledger(committer: Transactional) -> EpochLedger:
    return EpochLedger("job", sink=None, committer=committer)  # type: ignore[arg-type]


def test_output_goes_ahead_as_it_is_staged_and_the_commit_only_commits() -> None:
    committer = Transactional()
    books = ledger(committer)

    books.stage([(0, "a"), (1, "b")])
    assert committer.open == ["a", "b"]
    books.stage([(0, "c")])
    books.seal(1)
    assert committer.open == ["a", "b", "c"]

    books.commit_through(1)

    assert committer.commits == [(1, ["a", "b", "c"])] and committer.open == []


def test_output_after_a_pending_barrier_waits_for_that_checkpoint() -> None:
    committer = Transactional()
    books = ledger(committer)
    books.stage([(0, "a")])
    books.seal(1)

    books.stage([(0, "b")])  # epoch 2's: not in checkpoint 1's transaction
    books.seal(2)
    books.stage([(0, "c")])  # epoch 3's
    assert committer.open == ["a"]

    books.commit_through(1)
    assert committer.commits == [(1, ["a"])] and committer.open == ["b"]
    books.commit_through(2)
    assert committer.commits[-1] == (2, ["b"]) and committer.open == ["c"]


def test_an_aborted_epoch_stays_in_the_open_transaction_and_commits_with_the_next() -> None:
    committer = Transactional()
    books = ledger(committer)
    books.stage([(0, "a")])
    books.seal(1)
    books.stage([(0, "b")])
    assert committer.open == ["a"]

    books.fold(1)  # checkpoint 1 aborted: its output is the next epoch's
    assert committer.open == ["a", "b"]
    books.seal(2)
    books.commit_through(2)

    assert committer.commits == [(2, ["a", "b"])]


def test_a_completion_that_subsumes_earlier_epochs_commits_them_in_order() -> None:
    committer = Transactional()
    books = ledger(committer)
    books.stage([(0, "a")])
    books.seal(1)
    books.stage([(0, "b")])
    books.seal(2)

    books.commit_through(2)  # checkpoint 1's notification was lost: 2 covers it

    assert committer.commits == [(1, ["a"]), (2, ["b"])] and committer.open == []
    assert books.unpublished().keys() == {1, 2}, "named until the committer published them"


def test_a_sink_that_does_not_write_ahead_gets_epochs_only_when_they_commit() -> None:
    committer = Transactional(writes_ahead=False)
    books = ledger(committer)
    books.stage([(0, "a")])
    books.seal(1)
    books.commit_through(1)
    assert committer.ahead == 0 and committer.commits == [(1, ["a"])]


@pytest.mark.parametrize("seed", range(200))
def test_random_lifecycles_commit_each_file_once_with_its_own_checkpoint(seed: int) -> None:
    """Stages, barriers, completions (also of a later checkpoint before an earlier one's) and
    aborts in random order: a commit never carries a file staged after its checkpoint's barrier
    (`Transactional.submit` checks the transaction too), and every file is committed once."""
    rng = random.Random(seed)
    committer = Transactional()
    books = ledger(committer)
    staged_before: dict[str, int] = {}  # file -> the barriers sealed before it was staged
    pending: list[int] = []
    checkpoint, files = 0, 0
    for _ in range(rng.randint(5, 60)):
        op = rng.random()
        if op < 0.45:
            names = [f"f{files + i}" for i in range(rng.randint(0, 3))]
            files += len(names)
            for name in names:
                staged_before[name] = checkpoint
            books.stage([(rng.randint(0, 3), n) for n in names])
        elif op < 0.7:
            checkpoint += 1
            books.seal(checkpoint)
            pending.append(checkpoint)
        elif pending and op < 0.9:
            done = rng.choice(pending)
            count = len(committer.commits)
            books.commit_through(done)
            pending = [p for p in pending if p > done]
            for _, outputs in committer.commits[count:]:
                assert all(staged_before[o] < done for o in outputs), (done, outputs)
        elif pending:
            aborted = rng.choice(pending)
            books.fold(aborted)
            pending.remove(aborted)
    checkpoint += 1
    books.seal(checkpoint)
    books.commit_through(checkpoint)

    committed = [o for _, outputs in committer.commits for o in outputs]
    assert sorted(committed) == sorted(staged_before) and committer.open == []
    assert [e for e, _ in committer.commits] == sorted(e for e, _ in committer.commits)
