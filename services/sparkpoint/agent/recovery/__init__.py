"""Restoring a job: reading a checkpoint or savepoint (restore), its channel state (in-flight
records, channel_state), and splitting restored channel state by owner after a rescale while
the job runs (split, FLIP-547)."""
