"""sparkpoint: Flink-grade checkpointing for Spark pipelines, coordinated over Kafka."""
