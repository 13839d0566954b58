"""The history service's dashboard (``GET /``), rendered by headless Chromium against a
`sparkpoint history` process fed with one job's audit trail: what the page shows is read back
from the DOM Chromium dumps once the page has run its scripts.

Set ``SPARKPOINT_SCREENSHOT=/path/to/file.png`` to also save a screenshot of the page.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointSettings,
    ConfigChange,
    Event,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    SnapshotType,
    Subtask,
)
from sparkpoint.common.kafka import EventPublisher, make_producer
from sparkpoint.common.topics import (
    CHECKPOINT_EVENTS,
    CONFIG_CHANGES,
    JOBS,
    TopicSpec,
)
from tests.conftest import KafkaUnderTest
from tests.running_history import HistoryProcess

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)"),
]

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
VIRTUAL_TIME_MS = 8000
"""Chromium's virtual clock runs this long before the DOM is dumped: the first refresh and a few
of the 2 s auto-refreshes, whatever the machine's speed."""

FOLDED_WITHIN_S = 60.0
NAME = 'payments <b id="injected">enrich</b> & dedupe'
"""User input with markup in it: the dashboard must show it as text."""
SAVEPOINT_PATH = "s3://lake/savepoints/payments/savepoint-6-3f9a1c"
UPLOAD_FAILED = "keyed-1: upload to checkpoint storage failed"
DECLINED = "keyed-0 declined: <state backend> & 'disk full'"
LOST_LEADER = "source partition payments-3 lost its leader"
REGISTERED = {
    "execution.checkpointing.interval": "10 s",
    "execution.checkpointing.timeout": "10 min",
    "execution.checkpointing.dir": "s3://lake/checkpoints/payments",
    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
}
IN_FORCE = CheckpointSettings(10_000, 600_000, 0, 1, 0, 0, False)
"""The runtime settings the registration above comes to, as a coordinator reports them."""


# --- the audit trail -----------------------------------------------------------------------------


@dataclass
class AuditTrail:
    """One job's audit events, in the order its coordinator and agents would publish them."""

    job_id: str
    start: int
    events: list[tuple[TopicSpec, Event]] = field(default_factory=list)

    def at(self, seconds: float) -> int:
        return self.start + int(seconds * 1000)

    def registered(self, seconds: float, attempt: int, restored: tuple[int, str] | None) -> None:
        subtasks = [Subtask("keyed-0", 0, 0, 63), Subtask("keyed-1", 1, 64, 127)]
        self.events.append((JOBS, JobRegistered(
            self.job_id, NAME, f"agent-{attempt}", attempt, JobStatus.RUNNING, 2, 128, subtasks,
            REGISTERED, self.at(seconds),
            restored[0] if restored else None, restored[1] if restored else None,
        )))  # fmt: skip

    def restarting(self, seconds: float, attempt: int) -> None:
        self.events.append((JOBS, JobStatusChanged(
            self.job_id, f"agent-{attempt}", attempt, JobStatus.RESTARTING, self.at(seconds),
            message=LOST_LEADER, exception_name="ConnectionResetError", restart_delay_ms=1000,
        )))  # fmt: skip

    def checkpoint(
        self,
        checkpoint_id: int,
        seconds: float,
        duration_ms: int,
        failed: tuple[CheckpointFailureReason, str] | None = None,
        snapshot: SnapshotType = SnapshotType.CHECKPOINT,
        path: str | None = None,
    ) -> None:
        self._lifecycle(checkpoint_id, CheckpointEventType.TRIGGERED, snapshot, seconds)
        if failed is not None:
            self._lifecycle(
                checkpoint_id, CheckpointEventType.FAILED, snapshot, seconds + duration_ms / 1000,
                failure_reason=failed[0], message=failed[1], duration_ms=duration_ms,
            )  # fmt: skip
            return
        self._lifecycle(
            checkpoint_id, CheckpointEventType.COMPLETED, snapshot, seconds + duration_ms / 1000,
            external_path=path or f"s3://lake/checkpoints/payments/chk-{checkpoint_id}",
            duration_ms=duration_ms, state_size_bytes=1_500_000 + 250_000 * checkpoint_id,
        )  # fmt: skip

    def triggered(self, checkpoint_id: int, seconds: float) -> None:
        self._lifecycle(
            checkpoint_id, CheckpointEventType.TRIGGERED, SnapshotType.CHECKPOINT, seconds
        )

    def config_change(
        self, seconds: float, principal: str, rest_field: str, old: CheckpointSettings, **new: Any
    ) -> CheckpointSettings:
        """As the coordinator reports a PATCH: the settings in force before and after it."""
        after = dataclasses.replace(old, **new)
        version = sum(1 for topic, _ in self.events if topic is CONFIG_CHANGES) + 1
        self.events.append((CONFIG_CHANGES, ConfigChange(
            self.job_id, f"req-{version}", principal, self.at(seconds), old, after, [rest_field],
            version,
        )))  # fmt: skip
        return after

    def _lifecycle(
        self,
        checkpoint_id: int,
        kind: CheckpointEventType,
        snapshot: SnapshotType,
        seconds: float,
        **details: Any,
    ) -> None:
        self.events.append((CHECKPOINT_EVENTS, CheckpointLifecycleEvent(
            self.job_id, 1, checkpoint_id, kind, snapshot, self.at(seconds), **details,
        )))  # fmt: skip


def payments_job() -> AuditTrail:
    """Six completed checkpoints (one of them savepoint 6), two failed (4 and 8), one in progress
    (9); a restart restored from the savepoint; two configuration changes by two people."""
    trail = AuditTrail(f"payments-{uuid.uuid4().hex[:8]}", int(time.time() * 1000) - 15 * 60_000)
    trail.registered(0, attempt=0, restored=None)
    trail.checkpoint(1, 10, 850)
    trail.checkpoint(2, 20, 1200)
    trail.checkpoint(3, 30, 1500)
    trail.checkpoint(
        4, 40, 2300, failed=(CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, UPLOAD_FAILED)
    )
    settings = trail.config_change(
        45, "sre@example.com", "checkpointInterval", IN_FORCE, checkpoint_interval_ms=30_000
    )
    trail.checkpoint(5, 75, 1900)
    trail.checkpoint(6, 90, 4200, snapshot=SnapshotType.SAVEPOINT, path=SAVEPOINT_PATH)
    trail.restarting(100, attempt=0)
    trail.registered(102, attempt=1, restored=(6, SAVEPOINT_PATH))
    trail.config_change(
        110, "oncall@example.com", "checkpointTimeout", settings, checkpoint_timeout_ms=900_000
    )
    trail.checkpoint(7, 132, 1300)
    trail.checkpoint(
        8, 162, 600, failed=(CheckpointFailureReason.TASK_CHECKPOINT_FAILURE, DECLINED)
    )
    trail.triggered(9, 192)
    return trail


def publish(bootstrap: str, trail: AuditTrail) -> None:
    publisher = EventPublisher(make_producer(bootstrap), EventCodec())
    try:
        for topic, event in trail.events:
            publisher.publish_sync(topic, trail.job_id, event)
    finally:
        publisher.close()


# --- the rendered page ---------------------------------------------------------------------------


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def by_id(self, element_id: str) -> Node:
        found = [n for n in self.walk() if n.attrs.get("id") == element_id]
        assert len(found) == 1, f"expected one #{element_id}, found {len(found)}"
        return found[0]

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Node]:
        return [
            n
            for n in self.walk()
            if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)
        ]


VOID_ELEMENTS = frozenset(
    ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
     "wbr")
)  # fmt: skip


class DomBuilder(HTMLParser):
    """The DOM Chromium serialised, as a tree of `Node` (text unescaped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID_ELEMENTS:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = DomBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def chromium(url: str, profile: Path, *extra: str) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
         f"--virtual-time-budget={VIRTUAL_TIME_MS}", *extra, url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def squeezed(node: Node) -> str:
    return " ".join(node.text().split())


# --- the test ------------------------------------------------------------------------------------


def wait_folded(history: HistoryProcess, trail: AuditTrail) -> dict[str, Any]:
    """The job's document once every published event is folded in."""
    deadline = time.monotonic() + FOLDED_WITHIN_S
    last: Any = None
    while time.monotonic() < deadline:
        if history.process is not None and history.process.poll() is not None:
            raise AssertionError(f"the history service exited: {history.log()}")
        try:
            overview = history.get("/jobs/overview")
            listed = overview.status_code == 200 and any(
                j["sparkpoint.job_id"] == trail.job_id for j in overview.json()["jobs"]
            )
            if listed:
                last = history.get(f"/jobs/{trail.job_id}").json()
                if last["events"] == len(trail.events):
                    return last  # type: ignore[no-any-return]
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"{len(trail.events)} events not folded within {FOLDED_WITHIN_S} s (last: {last}): "
        f"{history.log()}"
    )


def test_the_dashboard_draws_the_jobs_checkpoints_changes_savepoints_and_failures(
    kafka: KafkaUnderTest, history: HistoryProcess, tmp_path: Path
) -> None:
    trail = payments_job()
    publish(kafka.bootstrap, trail)
    history.start()
    wait_folded(history, trail)
    stats = history.get(f"/jobs/{trail.job_id}/checkpoints").json()
    finished = {e["id"]: e for e in stats["history"] if e["status"] in ("COMPLETED", "FAILED")}
    assert sorted(finished) == [1, 2, 3, 4, 5, 6, 7, 8], stats["history"]

    url = f"{history.url}/?job={trail.job_id}"
    page = parse(chromium(url, tmp_path / "chromium", "--dump-dom"))
    screenshot = os.environ.get("SPARKPOINT_SCREENSHOT")
    if screenshot:
        chromium(url, tmp_path / "chromium-shot", f"--screenshot={screenshot}",
                 "--window-size=1280,1600")  # fmt: skip

    # the job list: the name is shown as text, its markup never became an element
    jobs = page.by_id("jobs")
    assert NAME in squeezed(jobs)
    assert not [n for n in page.walk() if n.attrs.get("id") == "injected"]
    selected = jobs.all("tr", "selected")
    assert [r.attrs.get("data-job-id") for r in selected] == [trail.job_id]

    # the chart: one point per finished checkpoint, failed and savepoints told apart
    chart = page.by_id("duration-chart")
    assert chart.tag == "svg"
    points = chart.all("circle", "point")
    assert sorted(int(p.attrs["data-id"]) for p in points) == sorted(finished)
    assert {int(p.attrs["data-id"]) for p in points if "failed" in p.classes} == {4, 8}
    assert {int(p.attrs["data-id"]) for p in points if "savepoint" in p.classes} == {6}
    assert len(chart.all("path", "savepoint-marker")) == 1
    heights = {int(p.attrs["data-id"]): float(p.attrs["cy"]) for p in points}
    assert heights[6] < heights[5] < heights[1], "a longer checkpoint is drawn higher"
    assert squeezed(page.by_id("x-axis-label")) == "checkpoint id"
    unit = re.fullmatch(r"end-to-end duration \((ms|s)\)", squeezed(page.by_id("y-axis-label")))
    assert unit is not None, squeezed(page.by_id("y-axis-label"))
    y_ticks = [float(squeezed(t)) for t in chart.all("text", "y-tick")]
    assert len(y_ticks) >= 3 and y_ticks == sorted(y_ticks) and y_ticks[0] == 0
    top = 4200 / 1000 if unit.group(1) == "s" else 4200
    assert y_ticks[-1] >= top > y_ticks[-2], f"the y axis ends above the slowest: {y_ticks}"
    x_ticks = [squeezed(t) for t in chart.all("text", "x-tick")]
    assert x_ticks[0] == "1" and x_ticks[-1] == "8", x_ticks

    # the configuration in force, the runtime overrides highlighted
    config = page.by_id("config")
    rows = {r.attrs["data-key"]: r for r in config.all("tr") if "data-key" in r.attrs}
    interval = rows["execution.checkpointing.interval"]
    assert "override" in interval.classes and "30 s" in squeezed(interval), squeezed(interval)
    assert "15 min" in squeezed(rows["execution.checkpointing.timeout"])
    assert "override" not in rows["execution.checkpointing.dir"].classes
    assert "s3://lake/checkpoints/payments" in squeezed(rows["execution.checkpointing.dir"])

    # who changed what, when: old -> new
    changes = [
        tuple(squeezed(row.all(cls=cls)[0]) for cls in ("principal", "setting", "old", "new"))
        for row in page.by_id("config-changes").all("tr", "change")
    ]
    assert changes == [
        ("oncall@example.com", "execution.checkpointing.timeout", "10 min", "15 min"),
        ("sre@example.com", "execution.checkpointing.interval", "10 s", "30 s"),
    ]

    # savepoints with their paths, failures with their reasons
    assert SAVEPOINT_PATH in squeezed(page.by_id("savepoints"))
    failures = squeezed(page.by_id("failures"))
    for reason in (UPLOAD_FAILED, DECLINED, LOST_LEADER, "ConnectionResetError"):
        assert reason in failures, failures

    counts = {
        tile.attrs["data-count"]: squeezed(tile.all(cls="n")[0])
        for tile in page.by_id("counts").all("div", "tile")
    }
    assert counts == {
        "total": "9", "completed": "6", "failed": "2", "in progress": "1", "restored": "1"
    }  # fmt: skip

    refreshed = squeezed(page.by_id("last-refresh"))
    assert re.search(r"every 2 s .*last refresh \d\d:\d\d:\d\d", refreshed), refreshed
