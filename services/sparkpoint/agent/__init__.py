"""The per-job Spark agent: key groups now; the runtime, state backend, sources and sinks with issue 5."""
