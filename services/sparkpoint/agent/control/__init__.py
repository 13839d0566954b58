"""The agent's voice towards the coordinator: registration and the lease (membership), and the
job's progress that every heartbeat carries (progress)."""
