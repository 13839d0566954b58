"""The coordinator's REST API in Flink's shapes: the app (app), its handlers grouped as Flink's
are (jobs, checkpoints, savepoints, cluster, and config for FLIP-571's update), what they share
(deps: the RestContext they are built with, the job lookups, Flink's error body), the models,
the views that build Flink's job answers (job_views) and progress (progress_views), and Flink's
own clients and dashboard (flink_compat)."""
