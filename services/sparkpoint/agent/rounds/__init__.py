"""A round of the job: the channels between the stages (channels) and what runs inside Spark
tasks: stage 1 (read, map, key groups: fetch), stage 2 (the keyed function over state:
process), the frames between them (frames) and the guard around the job's own code
(user_code)."""
