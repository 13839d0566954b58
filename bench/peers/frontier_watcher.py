"""Watches a bytewax recovery partition (SQLite) for bytewax_job.py, in a process of its own:
two copies of SQLite in one process (Python's and the one inside bytewax) break each other's
file locks, and a watcher inside the bytewax process never sees bytewax's writes.

``python frontier_watcher.py DB``: reads the highest worker frontier (the epoch a resume would
start from) every 5 ms until its standard input closes, then prints one JSON object: the
execution's first epoch and, for each frontier, the monotonic time it was first seen."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time

POLL_S = 0.005


def main() -> None:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    connection = sqlite3.connect(sys.argv[1], timeout=5)
    seen: dict[int, float] = {}
    while not stop.is_set():
        try:
            (row,) = connection.execute("SELECT MAX(worker_frontier) FROM fronts").fetchall()
        except sqlite3.OperationalError:  # busy for a moment: read again
            row = (None,)
        now = time.monotonic()
        if row[0] is not None and int(row[0]) not in seen:
            seen[int(row[0])] = now
        time.sleep(POLL_S)
    ((first_epoch,),) = connection.execute("SELECT MIN(resume_epoch) FROM exs").fetchall()
    connection.close()
    print(json.dumps({"first_epoch": first_epoch, "frontiers": seen}))


if __name__ == "__main__":
    main()
