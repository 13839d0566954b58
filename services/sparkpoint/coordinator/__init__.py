"""The checkpoint coordinator: pure decision logic (decider, pending, failures, store, stats,
scheduler, coordinator) and, later, the service that wires it to Kafka, timers and HTTP."""
