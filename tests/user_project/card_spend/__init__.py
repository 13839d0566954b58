"""A pipeline team's project, as a user of sparkpoint has it: its job (jobs.py) and its tests
(tests/), which use sparkpoint's public names only: the job API and sparkpoint.testing."""
