"""Which acks partitions the coordinator's answer reader lets go of and starts reading: a
partition it keeps is never re-positioned (answers queued there would be skipped), and a new
one starts at the offset captured when the instance took it, before it could trigger there
(starting at the end when the reader gets to it skipped answers to triggers sent meanwhile:
the first checkpoint after a takeover expired and the job failed over)."""

from __future__ import annotations

from sparkpoint.coordinator.service.acks import ack_assignment_changes


def test_a_kept_partition_is_left_alone_and_a_new_one_starts_where_it_was_taken() -> None:
    lost, gained = ack_assignment_changes({0: 10}, {0: 10, 1: 42})
    assert (lost, gained) == ([], [1])


def test_a_lost_partition_is_let_go() -> None:
    assert ack_assignment_changes({0: 10, 1: 42}, {1: 42}) == ([0], [])


def test_a_partition_taken_again_restarts_at_its_new_start() -> None:
    assert ack_assignment_changes({0: 10}, {0: 17}) == ([0], [0])


def test_nothing_changes_when_nothing_moved() -> None:
    assert ack_assignment_changes({0: 10, 1: 42}, {0: 10, 1: 42}) == ([], [])
