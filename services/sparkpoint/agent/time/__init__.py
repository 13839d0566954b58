"""Time: event time, watermarks (strategy.py: what a job declares; watermarks.py: the driver's
generator per source partition), as Flink's ``api.common.eventtime`` makes them."""
