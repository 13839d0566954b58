"""The coordinator: every registered job's checkpoint coordinator, in three rooms.

- ``core``: Flink's checkpoint decisions for one job, pure (no Kafka, no HTTP, no files; the
  time is an argument, effects are returned as commands); a test keeps it so.
- ``service``: the cores wired to Kafka, timers and checkpoint storage: partition ownership and
  fencing, replay, registration, the pipeline from acknowledgement to published completion,
  the operations the REST API asks for.
- ``rest``: Flink's REST API and the dashboards, one module per group of Flink's handlers.

``main`` starts an instance (``sparkpoint coordinator``).
"""
