"""The driver's books of keyed state over a long run: what installing a round costs the driver as
its key groups' logs grow. Writes bench/results/books.json.

A key group's log names every round's run since its base, and a base comes once per
materialization interval (``state.changelog.periodic-materialize.interval``, 10 minutes by
default): a live job running a round every 200 ms reaches some 3,000 runs per log. Here two
subtasks of 64 key groups each install a run per round that touches every key group (the example
job's 1,000 accounts touch them all), with the merges the books ask for, and no materialization,
for ``--rounds`` rounds; the figure is the driver's time per round over each stretch of 500
rounds, and the time of a checkpoint's plan (what it copies and reuses) at the end, after one
that copied everything completed and five more rounds ran.

Before the books were given what each change adds and removes (2026-11-29), installing compared
every touched key group's chain before and after, which costs its length: on this machine 14 ms
a round at 500 rounds, 40 at 1,000, 98 at 2,000 and 159 ms at 3,000; the plan after 3,000 rounds
took 27 ms before key groups touched together shared one log.
"""

from __future__ import annotations

import argparse
import time

from recording import write_results

from sparkpoint.agent.state.books import StateBackend
from sparkpoint.agent.state.runs import Written
from sparkpoint.common.keygroups import KeyGroupRange

RANGES = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
STRETCH = 500


def one_round(books: StateBackend, seq: int) -> None:
    for subtask, groups in enumerate(RANGES):
        asked = books.subtask_state(groups, seq, subtask, 0.0)
        merged = None
        if asked.merge:
            held = sorted({g for p in asked.merge for g in asked.live()[p]})
            merged = (asked.merge_path, 5, tuple(held))
        touched = tuple(range(groups.start, groups.end + 1))
        written = Written((books.run_path(seq, subtask), 10, touched), merged, {})
        books.install(asked, written, seq, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3_000)
    rounds = parser.parse_args().rounds
    books = StateBackend("/state")
    stretches = []
    started = time.perf_counter()
    for seq in range(1, rounds + 1):
        one_round(books, seq)
        if seq % STRETCH == 0:
            now = time.perf_counter()
            ms = (now - started) / STRETCH * 1000
            stretches.append({"rounds": seq, "ms_per_round": round(ms, 3)})
            print(f"rounds {seq - STRETCH + 1:>5}-{seq:>5}: {ms:7.2f} ms a round")
            started = now
    everything = KeyGroupRange(0, 127)
    first = books.plan(1, everything, True, "/chk-1", "/shared")  # copies every file
    books.release(source for _, source in first)
    books.complete(1, is_savepoint=False)
    for seq in range(rounds + 1, rounds + 6):  # a checkpoint interval's rounds
        one_round(books, seq)
    planned = time.perf_counter()
    plan = books.plan(2, everything, True, "/chk-2", "/shared")
    plan_ms = (time.perf_counter() - planned) * 1000
    log = len(books.chains[0].log)
    new = sum(1 for upload, _ in plan if upload.new)
    print(
        f"a checkpoint's plan after {rounds} rounds: {plan_ms:.1f} ms "
        f"({len(plan)} files named, {new} copied)"
    )
    results = {
        "benchmark": "books",
        "method": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "settings": {"rounds": rounds, "subtasks": 2, "key_groups": 128, "stretch": STRETCH},
        "stretches": stretches,
        "log_length_at_end": log,
        "plan_ms_at_end": round(plan_ms, 1),
        "before_the_change_ms_per_round": {"500": 14.1, "1000": 39.9, "2000": 97.6, "3000": 159.0},
        "plan_ms_before_logs_were_shared": 26.7,
    }
    print(f"wrote {write_results('books', results)}")


if __name__ == "__main__":
    main()
