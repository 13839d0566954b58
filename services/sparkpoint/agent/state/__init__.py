"""Keyed state: runs of changes and bases per key group (changelog), the files a stage-2 task
reads and writes (runs), the driver's books of them and of the checkpoints' copies (books), and
the file operations beneath (backend)."""
