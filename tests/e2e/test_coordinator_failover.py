"""Coordinator instances as processes, killed and paused as in production."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import free_port
from sparkpoint.common.events import TriggerCheckpoint
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.topics import create_topics
from tests.conftest import KafkaUnderTest
from tests.scripted_agent import Action, Answer, Script, ScriptedAgent

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")
TAKEOVER_S = 40.0
"""A SIGKILLed member leaves its group after session.timeout.ms (6 s); the survivor then joins
again (~3 s on the embedded broker) and replays. 40 s leaves room on a loaded machine."""


@dataclass
class Instance:
    process: subprocess.Popen[bytes]
    url: str

    def owns(self, job_id: str) -> bool:
        try:
            return (
                httpx.get(f"{self.url}/jobs/{job_id}/checkpoints/config", timeout=2).status_code
                == 200
            )
        except httpx.HTTPError:
            return False


@dataclass
class Cluster:
    kafka: KafkaUnderTest
    root: Path
    prefix: str
    instances: list[Instance]

    def start_instance(self) -> Instance:
        port = free_port()
        env = dict(os.environ, SPARKPOINT_TOPIC_PREFIX=self.prefix)
        process = subprocess.Popen(
            [SPARKPOINT, "coordinator", "--bootstrap", self.kafka.bootstrap, "--rest-port", str(port),
             "--config", str(self.root / "config.yaml")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        instance = Instance(process, f"http://127.0.0.1:{port}")
        self.instances.append(instance)
        until(lambda: _up(instance.url), 30, "REST up")
        return instance

    def owner(self, job_id: str) -> Instance:
        until(
            lambda: any(i.owns(job_id) for i in self.live()), TAKEOVER_S, f"an owner for {job_id}"
        )
        return next(i for i in self.live() if i.owns(job_id))

    def live(self) -> list[Instance]:
        return [i for i in self.instances if i.process.poll() is None]


def start_agent(
    cluster: Cluster, codec: EventCodec, interval: str, script: Script | None = None
) -> ScriptedAgent:
    configuration = {
        "execution.checkpointing.interval": interval,
        "execution.checkpointing.timeout": "10s",
    }
    agent = ScriptedAgent(
        cluster.kafka.bootstrap,
        codec,
        f"job-{uuid.uuid4().hex[:8]}",
        configuration=configuration,
        state_dir=cluster.root,
    )
    if script is not None:
        agent.script = script
    return agent.start()


def hang_from(checkpoint_id: int, epoch: int) -> Script:
    def script(trigger: TriggerCheckpoint, subtask: str) -> Answer:
        hang = trigger.owner_epoch == epoch and trigger.checkpoint_id >= checkpoint_id
        return Answer(Action.HANG if hang else Action.ACK)

    return script


def _redirects(other: Instance, owner: Instance, job_id: str) -> bool:
    response = httpx.get(f"{other.url}/jobs/{job_id}/checkpoints/config", timeout=2)
    return response.status_code == 307 and response.headers["location"].startswith(owner.url)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/jobs", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout_s} s")


@pytest.fixture
def cluster(kafka: KafkaUnderTest, tmp_path: Path) -> Iterator[Cluster]:
    prefix = f"f{uuid.uuid4().hex[:8]}."
    (tmp_path / "config.yaml").write_text(
        f"execution.checkpointing.dir: {tmp_path / 'checkpoints'}\n"
        f"execution.checkpointing.savepoint-dir: {tmp_path / 'savepoints'}\n"
    )
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = prefix
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    running = Cluster(kafka, tmp_path, prefix, [])
    try:
        yield running
    finally:
        os.environ.pop("SPARKPOINT_TOPIC_PREFIX", None)
        for instance in running.instances:
            if instance.process.poll() is None:
                instance.process.send_signal(signal.SIGCONT)
                instance.process.kill()
                instance.process.wait(10)


def test_the_new_owner_applies_the_override_and_never_reuses_an_id(
    cluster: Cluster, codec: EventCodec
) -> None:
    first, second = cluster.start_instance(), cluster.start_instance()
    # the first owner's checkpoints from id 3 on are never acknowledged: one is pending when it dies
    agent = start_agent(cluster, codec, "300ms", hang_from(3, epoch=1))
    try:
        owner = cluster.owner(agent.job_id)
        other = next(i for i in (first, second) if i is not owner)
        agent.wait_for(lambda: len(agent.completed) >= 2, what="checkpoints before the failover")
        until(
            lambda: _redirects(other, owner, agent.job_id),
            20,
            "the other instance redirects to the owner",
        )
        # The PATCH goes to the instance that does not own the job: it is redirected (307).
        patched = httpx.patch(
            f"{other.url}/jobs/{agent.job_id}/checkpoints/configuration",
            json={"checkpointTimeout": 45_000},
            timeout=10,
            follow_redirects=True,
        )
        assert patched.status_code == 200, patched.text
        assert patched.history and patched.history[0].status_code == 307
        agent.wait_for(lambda: agent.triggers[-1].checkpoint_id >= 3, what="a pending checkpoint")
        ids_before = [t.checkpoint_id for t in agent.triggers]

        owner.process.kill()  # SIGKILL: no goodbye to the group
        survivor = next(i for i in (first, second) if i is not owner)
        until(lambda: survivor.owns(agent.job_id), TAKEOVER_S, "takeover")
        config = httpx.get(
            f"{survivor.url}/jobs/{agent.job_id}/checkpoints/config", timeout=5
        ).json()
        seen = len(agent.triggers)
        agent.wait_for(
            lambda: len(agent.completed) >= 2 and len(agent.triggers) >= seen + 2,
            what="checkpoints after takeover",
        )
    finally:
        agent.stop()

    assert config["timeout"] == 45_000  # the override, with no API call to the new owner
    ended = {c.checkpoint_id for c in agent.completed} | {a.checkpoint_id for a in agent.aborted}
    assert set(ids_before) <= ended  # what the dead owner left pending was aborted by the new one
    assert any(a.reason.name == "CHECKPOINT_COORDINATOR_SUSPEND" for a in agent.aborted), (
        [(t.checkpoint_id, t.owner_epoch) for t in agent.triggers],
        [c.checkpoint_id for c in agent.completed],
        [(a.checkpoint_id, a.reason.name, a.owner_epoch) for a in agent.aborted],
        ids_before,
        agent.stale,
    )
    ids_after = [t.checkpoint_id for t in agent.triggers[len(ids_before) :]]
    assert min(ids_after) > max(ids_before)
    all_ids = [t.checkpoint_id for t in agent.triggers]
    assert all_ids == sorted(set(all_ids))
    assert agent.triggers[-1].owner_epoch > agent.triggers[0].owner_epoch


def test_a_stale_instance_that_resumes_publishes_nothing_agents_accept(
    cluster: Cluster, codec: EventCodec
) -> None:
    """A zombie (SIGSTOPped past its session) wakes with its timers overdue: nothing it sends
    under its old epoch is accepted. Waking, it rejoins the group, and the rebalance may give
    it the job back: then it takes it over as any new owner does, with an epoch newer than the
    survivor's (a fenced takeover, not a stale publisher), and checkpoint ids go on growing."""
    first, second = cluster.start_instance(), cluster.start_instance()
    agent = start_agent(cluster, codec, "200ms")
    try:
        owner = cluster.owner(agent.job_id)
        agent.wait_for(lambda: len(agent.completed) >= 2, what="checkpoints before the pause")
        old_epoch = agent.triggers[-1].owner_epoch
        owner.process.send_signal(signal.SIGSTOP)  # a zombie: alive, but silent past its session
        survivor = next(i for i in (first, second) if i is not owner)
        until(lambda: survivor.owns(agent.job_id), TAKEOVER_S, "takeover")
        agent.wait_for(
            lambda: agent.triggers[-1].owner_epoch > old_epoch, what="a trigger from the new owner"
        )
        accepted = len(agent.triggers)
        owner.process.send_signal(signal.SIGCONT)  # the zombie wakes with its timers overdue
        time.sleep(3)
        agent.wait_for(lambda: len(agent.completed) >= 4, what="checkpoints after the zombie woke")
    finally:
        agent.stop()

    survivor_epoch = agent.triggers[accepted - 1].owner_epoch
    after = [t.owner_epoch for t in agent.triggers[accepted - 1 :]]
    assert survivor_epoch > old_epoch and all(e >= survivor_epoch for e in after), after
    ids = [t.checkpoint_id for t in agent.triggers]
    assert ids == sorted(set(ids))
    until(
        lambda: sum(i.owns(agent.job_id) for i in cluster.live()) == 1, 20, "one owner in the end"
    )


def test_a_rebalance_when_an_instance_joins_keeps_ids_increasing(
    cluster: Cluster, codec: EventCodec
) -> None:
    first = cluster.start_instance()
    agent = start_agent(cluster, codec, "100ms")
    try:
        cluster.owner(agent.job_id)
        agent.wait_for(lambda: len(agent.completed) >= 5, what="checkpoints before the rebalance")
        before = len(agent.triggers)
        cluster.start_instance()  # joining makes the group revoke and reassign everything
        agent.wait_for(
            lambda: agent.triggers[-1].owner_epoch > agent.triggers[0].owner_epoch,
            what="a new epoch",
        )
        agent.wait_for(lambda: len(agent.completed) >= 10, what="checkpoints after the rebalance")
    finally:
        agent.stop()
    ids = [t.checkpoint_id for t in agent.triggers]
    assert ids == sorted(set(ids)), ids
    assert len(ids) > before
    assert first.process.poll() is None
