"""A round of the job: the channels between the stages (channels) and what runs inside Spark
tasks, stage 1 (read, map, key groups) and stage 2 (the keyed function over state) (stages)."""
