"""What every sparkpoint service shares: events and their Avro codec, Kafka clients and topics,
the embedded broker."""
