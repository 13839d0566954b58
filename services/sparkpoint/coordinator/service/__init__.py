"""The coordinator service: every job's core wired to Kafka, timers and storage. It owns
partitions of the jobs topic and with them jobs (ownership), replays their history and admits
registrations (registry, starting), reads acknowledgements (acks), carries out the cores'
commands through to ``_metadata`` and completion (pipeline, files, timers), publishes with
transactional fencing (publisher, writer), and runs what the REST API asks (operations); the
service itself (instance) only wires them."""
