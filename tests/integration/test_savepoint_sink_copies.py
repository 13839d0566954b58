"""A savepoint copies the staged sink output it names, on real files, while the committer may
publish and delete it: an epoch is kept whole, for every subtask, or not at all (part of one
made a restore refuse with SinkConflict: its digest no longer matched what the sink
published)."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.agent.checkpointing.copies import self_contained
from sparkpoint.agent.sinks import outputs_digest


def test_an_epoch_whose_files_the_committer_deleted_is_left_out_for_every_subtask(
    tmp_path: Path,
) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in ("e2-s0.arrow", "e3-s0.arrow", "e3-s1.arrow"):
        (staged / name).write_bytes(name.encode())
    epochs = {
        2: [(0, str(staged / "e2-s0.arrow")), (1, str(staged / "e2-s1.arrow"))],  # s1 published
        3: [(0, str(staged / "e3-s0.arrow")), (1, str(staged / "e3-s1.arrow"))],
    }
    target = tmp_path / "savepoint"

    kept = self_contained(epochs, str(target))

    assert list(kept) == [3], "epoch 2 was published: no subtask names part of it"
    assert kept[3] == [(0, "sink/e3-s0.arrow"), (1, "sink/e3-s1.arrow")]
    assert (target / "sink" / "e3-s1.arrow").read_bytes() == b"e3-s1.arrow"
    names = [str(target / name) for _, name in kept[3]]
    assert outputs_digest(names) == outputs_digest([path for _, path in epochs[3]])
