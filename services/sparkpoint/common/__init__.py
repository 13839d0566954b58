"""What every part of sparkpoint shares: events and their Avro codec (events, avro,
avro_compiled), Kafka clients and topics (kafka, topics, broker: the embedded broker), storage
paths and files (paths: pure, storage: fsspec), checkpoint metadata, key groups, settings and
Flink's option table, restart strategies, limits, clocks and Flink's job ids."""
