"""The agent's Spark: the session and its scheduler pools (session), the class archive that
starts it sooner (class_archive), a standalone cluster for tests and benchmarks (standalone),
and what the driver ships to and gets from tasks (traffic)."""
