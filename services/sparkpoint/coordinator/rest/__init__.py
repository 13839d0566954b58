"""The coordinator's REST API in Flink's shapes (app, models), the views that build Flink's job
answers (job_views) and progress (progress_views), and Flink's own clients and dashboard
(flink_compat)."""
