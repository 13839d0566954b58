"""The coordinator in Docker, for teams whose CI tests against containers: `SparkpointContainer`
builds the image of ``deploy/Dockerfile`` (or takes a tag already built) and runs
``sparkpoint coordinator`` in it on the test's broker. It is a `CoordinatorProcess` to the
rest of sparkpoint.testing: ``run_job`` and its faults (the coordinator killed and started
again) work the same with either.

The container shares the host's network (Linux; the broker's address is the test's) and mounts
the storage root at the same path, so the agents (processes on the host) and the coordinator
read and write the same checkpoints. `coordinator_for_tests` chooses: the container when asked
(``SPARKPOINT_TEST_CONTAINERS=1``) and a Docker engine answers, else the coordinator as a local
process (the fallback, and the default).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sparkpoint.testing.cluster import CoordinatorProcess, docker_answers

IMAGE = "sparkpoint:test"


class SparkpointContainer(CoordinatorProcess):
    def __init__(
        self,
        bootstrap: str,
        root: Path,
        image: str = IMAGE,
        build_context: Path | None = None,
    ) -> None:
        """``build_context``: a sparkpoint source tree whose ``deploy/Dockerfile`` is built
        into ``image`` first; None: ``image`` exists already."""
        super().__init__(bootstrap, root)
        self.image = image
        self.build_context = build_context
        self.container: Any = None

    def command(self) -> list[str]:
        return [
            "sparkpoint", "coordinator", "--bootstrap", self.bootstrap,
            "--rest-host", "127.0.0.1", "--rest-port", str(self.port),
            "--config", str(self.config),
        ]  # fmt: skip

    def start(self, timeout_s: float = 120.0) -> SparkpointContainer:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.image import DockerImage

        if self.build_context is not None and self.starts == 0:
            DockerImage(
                path=self.build_context, tag=self.image, dockerfile_path="deploy/Dockerfile",
                clean_up=False,
            ).build()  # fmt: skip
        self.prepare()
        prefix = os.environ.get("SPARKPOINT_TOPIC_PREFIX")
        container = (
            DockerContainer(self.image)
            .with_command(self.command())
            .with_volume_mapping(str(self.root), str(self.root), mode="rw")
            .with_kwargs(network_mode="host")
        )
        if prefix is not None:
            container = container.with_env("SPARKPOINT_TOPIC_PREFIX", prefix)
        self.container = container.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.get("/jobs/overview") is not None:
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the coordinator container did not answer within {timeout_s:.0f} s")

    def kill(self) -> None:
        if self.container is not None:
            self.container.get_wrapped_container().kill()
            self.container.stop()
            self.container = None

    def stop(self) -> None:
        if self.container is not None:
            self.container.stop()
            self.container = None


def coordinator_for_tests(bootstrap: str, root: Path) -> CoordinatorProcess:
    """`SparkpointContainer` when ``SPARKPOINT_TEST_CONTAINERS=1`` and Docker answers (image
    ``SPARKPOINT_TEST_IMAGE``, default ``sparkpoint:test``, built from
    ``SPARKPOINT_TEST_BUILD_CONTEXT`` when set), else a coordinator process. Not started."""
    if os.environ.get("SPARKPOINT_TEST_CONTAINERS") == "1" and docker_answers():
        context = os.environ.get("SPARKPOINT_TEST_BUILD_CONTEXT")
        return SparkpointContainer(
            bootstrap, root, os.environ.get("SPARKPOINT_TEST_IMAGE", IMAGE),
            Path(context) if context else None,
        )  # fmt: skip
    return CoordinatorProcess(bootstrap, root)
