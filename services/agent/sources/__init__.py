"""Sources: what stage 1 reads. Only Kafka for now (sources/kafka.py)."""
