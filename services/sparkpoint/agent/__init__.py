"""The agent: one process per job, the job's Spark driver and its voice in the checkpoint
protocol. Its rooms:

- ``job``, ``formats``, ``example``: the job API users write against (`sparkpoint` re-exports
  it), value formats, the bundled example job;
- ``runtime``: the agent's lifecycle (start, restart, end); ``loop``: one attempt's loop, which
  only plans and calls; ``attempt``: the parts an attempt is made of; ``options``: how it runs;
- ``rounds``: stage 1 and stage 2 as Spark jobs, and the channels between them;
- ``checkpointing``: barriers as explicit states, snapshots, acknowledgements;
- ``control``: registration, lease, control events, the job's progress;
- ``recovery``: restoring snapshots and their channel state (FLIP-547's split);
- ``state``: keyed state files per key group; ``sources``, ``sinks``: Kafka and files;
- ``spark``: the session, its class archive, the jobs the agent runs on it;
- ``faults``: scripted crash points for tests.
"""
