"""Watches a bytewax recovery partition (SQLite) for bytewax_job.py, in a process of its own:
two copies of SQLite in one process (Python's and the one inside bytewax) break each other's
file locks, and a watcher inside the bytewax process never sees bytewax's writes.

``python frontier_watcher.py DB``: reads the highest worker frontier (the epoch a resume would
start from) every 50 ms until its standard input closes, then prints one JSON object: the
execution's first epoch, for each frontier the monotonic time it was first seen, and the CPU
seconds this process spent and over how many seconds.

50 ms keeps this process under 1% of a core (measured here: 0.55% at 50 ms, 1.2% at 20 ms,
2.4% at 5 ms, on a 2-core machine where the peer it measures uses one): a watcher must not
slow the system it watches. A frontier is therefore seen up to 50 ms after it was written (25
ms on average), which the snapshot durations include."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time

POLL_S = 0.05


def main() -> None:
    began = time.monotonic()
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
    figures = {
        "first_epoch": first_epoch,
        "frontiers": seen,
        "cpu_seconds": time.process_time(),
        "seconds": time.monotonic() - began,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
