"""The coordinator service: every job's core wired to Kafka, timers and storage. It owns
partitions of the jobs topic (and with them jobs), replays their store, admits registrations,
reads acknowledgements (acks), finalizes checkpoints (files), publishes with transactional
fencing (writer), and runs savepoints and runtime changes (instance)."""
