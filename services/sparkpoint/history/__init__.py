"""The history service: the audit topics folded into one document per job, kept in a faust
table, served over REST and as a dashboard."""
