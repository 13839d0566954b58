"""``/openapi.json`` documents every status each operation answers, with Flink's error body, and
a schemathesis run against a live coordinator (a real job, its checkpoints and triggers) finds no
server error, no undocumented status, content type or body."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sparkpoint.common.avro import EventCodec
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait
from tests.scripted_agent import ScriptedAgent

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

# Bounded: the fuzzing phase draws at most this many cases per operation (the examples and
# coverage phases add their fixed sets); no shrinking, a fixed seed so a run is reproducible.
MAX_EXAMPLES = 25
SEED = 571


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    tmp_path = tmp_path_factory.mktemp("coordinator")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path)


# What the real job is PATCHed back to after a fuzzed PATCH reached it: a generated body may set
# a 1 ms interval and timeout, which would keep the job (and the 2-core machine) busy for the rest
# of the run and push the known checkpoints out of its 10-entry history.
CALM = {
    "checkpointInterval": 3_600_000,
    "checkpointTimeout": 600_000,
    "minPauseBetweenCheckpoints": 0,
    "maxConcurrentCheckpoints": 1,
    "tolerableCheckpointFailureNumber": 1_000,
}


@dataclass
class LiveJob:
    """A running job with a completed checkpoint and savepoint, and the trigger ids of both."""

    agent: ScriptedAgent
    client: httpx.Client
    checkpoint_trigger: str
    savepoint_trigger: str

    @property
    def job_id(self) -> str:
        return self.agent.job_id

    def aim(self, case: Any) -> None:
        """Points about half the generated requests at the real job (and, of those, about half
        at a checkpoint in its history or at its real triggers), so that job-scoped operations
        answer 200 as well as 404. The choice hashes what was generated, not a counter."""
        params = case.path_parameters
        if not params or "jobid" not in params:
            return
        body = case.body if isinstance(case.body, (dict, list, str, bytes, int, float)) else None
        if not _picked(params, body):
            return
        params["jobid"] = self.job_id
        checkpoint = params.get("checkpointid")
        if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and _picked(checkpoint):
            params["checkpointid"] = self.latest_checkpoint()
        if "triggerid" in params and _picked(params["triggerid"]):
            savepoint = "/savepoints/" in case.operation.path
            params["triggerid"] = self.savepoint_trigger if savepoint else self.checkpoint_trigger

    def latest_checkpoint(self) -> int:
        history = self.client.get(f"/jobs/{self.job_id}/checkpoints").json()["history"]
        return int(history[0]["id"])

    def calm(self, case: Any) -> None:
        if case.method.upper() == "PATCH" and case.path_parameters.get("jobid") == self.job_id:
            path = f"/jobs/{self.job_id}/checkpoints/configuration"
            restored = self.client.patch(path, json=CALM)
            assert restored.status_code == 200, restored.text


def _picked(*generated: object) -> bool:
    return hashlib.sha256(repr(generated).encode("utf-8", "surrogatepass")).digest()[0] % 2 == 0


def _completed(client: httpx.Client, path: str) -> bool:
    return bool(client.get(path).json()["status"]["id"] == "COMPLETED")


@pytest.fixture(scope="module")
def live_job(coordinator: Running, codec: EventCodec) -> Iterator[LiveJob]:
    agent = coordinator.agent(codec, configuration={})
    job = f"/jobs/{agent.job_id}"
    with coordinator.client() as client:
        checkpoint = client.post(f"{job}/checkpoints", json={}).json()["request-id"]
        wait(lambda: _completed(client, f"{job}/checkpoints/{checkpoint}"), what="a checkpoint")
        savepoint = client.post(f"{job}/savepoints", json={}).json()["request-id"]
        wait(lambda: _completed(client, f"{job}/savepoints/{savepoint}"), what="a savepoint")
        yield LiveJob(agent, client, checkpoint, savepoint)
    agent.stop()


@pytest.fixture(scope="module")
def api_schema(coordinator: Running, live_job: LiveJob) -> Any:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": MAX_EXAMPLES, "no-shrink": True, "database": "none"},
            "request-timeout": 15,
        }
    )
    return schemathesis.openapi.from_url(f"{coordinator.url}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32's lazy schemas read and rename ``node._nodeid``, which pytest 9.2 no
    longer has (it keeps ``_id``): give it the attribute it expects."""
    node: Any = request.node
    if not hasattr(node, "_nodeid"):
        node._nodeid = node.nodeid


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_documented(case: Any, live_job: LiveJob) -> None:
    live_job.aim(case)
    # a 307 to the owning instance is itself a documented answer: never follow it
    case.call_and_validate(checks=CHECKS, allow_redirects=False)
    live_job.calm(case)


def test_a_job_another_instance_owns_is_a_documented_307(
    coordinator: Running, api_schema: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one instance no job is owned elsewhere: pretend one is, and every operation that
    declares a 307 answers it as declared (Location to the owner, nothing else)."""
    owner = "http://127.0.0.1:9"
    monkeypatch.setattr(
        coordinator.service,
        "route",
        lambda job_id, tried=(): (owner, 0) if job_id == "elsewhere" else None,
    )
    redirecting = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if "307" not in operation.responses.status_codes or "{jobid}" not in operation.path:
            continue  # a disposal is redirected by the savepoint's job, read from storage
        params = {
            name: "1"
            for name in ("checkpointid", "triggerid", "vertexid")
            if name in operation.path
        }
        if "{what}" in operation.path:
            params["what"] = "watermarks"
        with_body = operation.method.upper() == "PATCH" and operation.body  # the config update
        body = {} if with_body else NOT_SET
        case = operation.Case(path_parameters={"jobid": "elsewhere", **params}, body=body)
        response = case.call_and_validate(
            checks=[*CHECKS, response_headers_conformance], allow_redirects=False
        )
        assert response.status_code == 307, (operation.label, response.text)
        sent = urlsplit(response.request.url)
        assert response.headers["location"] == [f"{owner}{sent.path}"], operation.label
        redirecting.append(operation.label)
    assert len(redirecting) == 17, redirecting


# --- the declarations themselves ------------------------------------------------------------------


ERRORS = {"$ref": "#/components/schemas/Errors"}


def test_openapi_lists_each_operations_codes_and_no_422(coordinator: Running) -> None:
    with coordinator.client() as client:
        document = client.get("/openapi.json").json()
    paths = document["paths"]

    def codes(path: str, method: str) -> set[str]:
        return set(paths[path][method]["responses"])

    every = {(path, method) for path, ops in paths.items() for method in ops}
    assert all("422" not in codes(path, method) for path, method in every)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert document["components"]["schemas"]["Errors"]["properties"]["errors"] == {
        "items": {"type": "string"},
        "type": "array",
        "title": "Errors",
    }

    patch = ("/jobs/{jobid}/checkpoints/configuration", "patch")
    assert codes(*patch) == {"200", "307", "400", "404", "409", "503"}
    assert codes("/jobs/{jobid}/checkpoints/details/{checkpointid}", "get") == {
        "200",
        "307",
        "400",
        "404",
    }
    assert codes("/jobs/{jobid}/checkpoints", "post") == {"200", "307", "400", "404"}
    assert codes("/jobs/{jobid}/savepoints/{triggerid}", "get") == {"200", "307", "404"}
    assert codes("/jobs/{jobid}/savepoints", "get") == {"200", "307", "404"}
    assert codes("/jobs", "get") == {"200"}
    for path, method in every:
        for code, answer in paths[path][method]["responses"].items():
            if code.startswith("4") or code.startswith("5"):
                assert answer["content"]["application/json"]["schema"] == ERRORS, (path, code)
    assert "Location" in paths[patch[0]][patch[1]]["responses"]["307"]["headers"]
    config = paths["/jobs/{jobid}/checkpoints/config"]["get"]["responses"]["200"]
    assert config["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CheckpointConfigInfo"
    }


# --- requests that once answered 500, or could -----------------------------------------------------

JSON = {"content-type": "application/json"}
ODD_REQUESTS = [
    # path parameters: huge, negative, oversized and non-numeric ids, non-UTF-8 and NUL ids
    ("GET", "{job}/checkpoints/details/" + "9" * 30, {}, 404, "not found in the history"),
    ("GET", "{job}/checkpoints/details/" + "9" * 5000, {}, 400, "path.checkpointid"),
    ("GET", "{job}/checkpoints/details/-1", {}, 404, "not found in the history"),
    ("GET", "/jobs/%FF/checkpoints/details/%FF", {}, 400, "path.checkpointid"),
    ("GET", "/jobs/%FF%FE/checkpoints", {}, 404, "not found"),
    ("GET", "/jobs/%00/savepoints", {}, 404, "not found"),
    ("GET", "/jobs/" + "x" * 5000 + "/savepoints", {}, 404, "not found"),
    ("GET", "{job}/checkpoints/%FF", {}, 404, "No checkpoint request"),
    ("GET", "{job}/savepoints/%C0%AF", {}, 404, "No savepoint request"),
    # bodies: empty, not JSON, not UTF-8, too deep, of the wrong JSON type, out of range
    ("POST", "{job}/checkpoints", {"content": b"not json", "headers": JSON}, 400, "body"),
    ("POST", "{job}/checkpoints", {"content": b"\xff\xfe", "headers": JSON}, 400, "body"),
    ("POST", "{job}/checkpoints", {"content": b"[" * 100_000, "headers": JSON}, 400, "body"),
    ("POST", "{job}/checkpoints", {"json": []}, 400, "body"),
    ("POST", "{job}/savepoints", {"json": "CANONICAL"}, 400, "body"),
    ("POST", "{job}/stop", {"json": 1}, 400, "body"),
    ("PATCH", "{job}/checkpoints/configuration", {"content": b""}, 400, "body"),
    ("PATCH", "{job}/checkpoints/configuration", {"json": None}, 400, "body"),
    ("PATCH", "{job}/checkpoints/configuration", {"json": ["x"]}, 400, "body"),
    ("PATCH", "{job}/checkpoints/configuration", {"json": {"checkpointInterval": "5"}}, 400, "checkpointInterval"),
    ("PATCH", "{job}/checkpoints/configuration", {"json": {"checkpointInterval": 10**30}}, 400, "checkpointInterval"),
    ("PATCH", "{job}/checkpoints/configuration", {"json": {"maxConcurrentCheckpoints": 2**31}}, 400, "maxConcurrentCheckpoints"),
    ("PATCH", "{job}/checkpoints/configuration", {"content": b'{"checkpointTimeout": 1e400}', "headers": JSON}, 400, "checkpointTimeout"),
    ("PATCH", "{job}/checkpoints/configuration", {"content": b'{"minPauseBetweenCheckpoints": NaN}', "headers": JSON}, 400, "minPauseBetweenCheckpoints"),
    # target directories no file system or event takes
    ("POST", "{job}/savepoints", {"json": {"target-directory": "\x00"}}, 400, "target-directory"),
    ("POST", "{job}/savepoints", {"json": {"target-directory": "~no-such-user-here/x"}}, 400, "target-directory"),
    ("POST", "{job}/savepoints", {"content": b'{"target-directory": "{root}/\\udcff"}', "headers": JSON}, 400, "target-directory"),
    ("POST", "{job}/savepoints", {"json": {"target-directory": "{root}/" + "x" * 5000}}, 400, "target-directory"),
    ("POST", "{job}/stop", {"json": {"targetDirectory": "a\x00b"}}, 400, "targetDirectory"),
    ("POST", "{job}/stop", {"json": {"targetDirectory": "~no-such-user-here"}}, 400, "targetDirectory"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "request_kwargs", "status", "names"), ODD_REQUESTS)
def test_odd_requests_are_answered_in_flinks_error_shape(
    coordinator: Running,
    live_job: LiveJob,
    method: str,
    path: str,
    request_kwargs: dict[str, Any],
    status: int,
    names: str,
) -> None:
    root = str(coordinator.root / "savepoints")

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{root}", root)
        if isinstance(value, bytes):
            return value.replace(b"{root}", root.encode())
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    with coordinator.client() as client:
        response = client.request(
            method, path.replace("{job}", f"/jobs/{live_job.job_id}"), **fill(request_kwargs)
        )
    assert response.status_code == status, response.text
    errors = response.json()["errors"]
    assert isinstance(errors, list) and names in errors[0], errors


def test_savepoint_directories_with_foreign_metadata_are_not_listed(
    coordinator: Running, live_job: LiveJob
) -> None:
    root = coordinator.root / "savepoints"
    prefix = f"savepoint-{live_job.job_id[:6]}-"
    foreign = {
        "list": b"[]",
        "no-id": f'{{"job_id": "{live_job.job_id}"}}'.encode(),
        "binary": b"\xff",
    }
    for name, metadata in foreign.items():
        (root / f"{prefix}{name}").mkdir(parents=True)
        (root / f"{prefix}{name}" / "_metadata").write_bytes(metadata)
    (root / f"{prefix}dir" / "_metadata").mkdir(parents=True)
    with coordinator.client() as client:
        response = client.get(f"/jobs/{live_job.job_id}/savepoints")
    assert response.status_code == 200, response.text
    listed = {PurePosixPath(s["location"]).name for s in response.json()["savepoints"]}
    assert listed, "the live job's own savepoints"
    assert not listed & {f"{prefix}{name}" for name in [*foreign, "dir"]}
