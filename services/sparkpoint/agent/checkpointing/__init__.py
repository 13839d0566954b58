"""The subtask side of the checkpoint protocol: where barriers go and when a checkpoint is
aligned (barriers), and each subtask's snapshot, acknowledgement, completion and abort
(snapshots)."""
