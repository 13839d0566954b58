"""The coordinator's pure core: Flink's checkpoint decisions for one job (coordinator), the
request decider, pending checkpoints, the failure manager, the periodic scheduler, the completed
checkpoint store and the statistics; what may touch a running job (admission). No Kafka, no
HTTP, no files: every input comes in as an argument, every effect goes out as a command
(commands), and the clock is a number."""
