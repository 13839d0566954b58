"""The compacted-topic store of runtime checkpoint-configuration overrides (FLIP-571)."""
