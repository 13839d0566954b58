"""Records a real Flink 2.3's REST answers, the reference of `tests/integration/test_flink_rest.py`.

Run with the `apache-flink` package installed (`make compat` makes such a venv, .venv-compat):

    .venv-compat/bin/python tests/compat/record_flink_samples.py

It starts PyFlink's local MiniCluster with its REST endpoint on a free port, runs a small SQL
job (datagen -> keyed count -> blackhole) with checkpoints every 2 s, asks for what Flink's CLI
and dashboard ask for (and a savepoint, its disposal, a stop with a savepoint), and writes the
answers to tests/data/flink-2.3/rest-samples.json, with the job's JobID replaced by ``{jid}`` and
error bodies cut to their first line (the rest is the JVM's stack).
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "data" / "flink-2.3" / "rest-samples.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(base: str, path: str, method: str = "GET", body: Any = None) -> tuple[Any, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, method=method, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError as exc:  # the MiniCluster shuts down once its only job has ended
        return None, repr(exc)


def main() -> int:
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    port = free_port()
    storage = Path(tempfile.mkdtemp(prefix="flink-samples-"))
    conf = Configuration()
    for key, value in {
        "rest.port": str(port),
        "rest.bind-port": str(port),
        "execution.checkpointing.interval": "2s",
        "state.checkpoints.dir": f"file://{storage}/checkpoints",
        "state.savepoints.dir": f"file://{storage}/savepoints",
    }.items():
        conf.set_string(key, value)
    settings = (
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    )
    tables = TableEnvironment.create(settings)
    tables.execute_sql(
        "CREATE TABLE src (k INT, x BIGINT) WITH ('connector'='datagen', "
        "'rows-per-second'='50', 'fields.k.min'='0', 'fields.k.max'='9')"
    )
    tables.execute_sql("CREATE TABLE snk (k INT, c BIGINT) WITH ('connector'='blackhole')")
    result = tables.execute_sql("INSERT INTO snk SELECT k, COUNT(*) FROM src GROUP BY k")
    client = result.get_job_client()
    assert client is not None
    jid = str(client.get_job_id())
    base = f"http://127.0.0.1:{port}"
    time.sleep(7)  # a few checkpoints
    answers: dict[str, Any] = {}

    def record(name: str, path: str, method: str = "GET", body: Any = None) -> Any:
        status, answer = call(base, path, method, body)
        answers[name] = (status, answer)
        print(status, name, flush=True)
        return answer

    for path in (
        "/config", "/overview", "/jobs", "/jobs/overview", "/jobs/{jid}", "/jobs/{jid}/exceptions",
        "/jobs/{jid}/config", "/jobs/{jid}/checkpoints", "/jobs/{jid}/checkpoints/config",
        "/taskmanagers", "/jobmanager/config", "/jobs/{jid}/plan", "/jobs/{jid}/jobmanager/config",
        "/v1/jobs/overview", "/v1/config", "/jobs/ffffffffffffffffffffffffffffffff",
        "/jobs/not-a-jid",
    ):  # fmt: skip
        record(f"GET {path}", path.replace("{jid}", jid))
    # what the dashboard's pages ask for besides (Flink 2.3 groups jobs into applications)
    record("GET /applications/overview", "/applications/overview")
    vertex = answers["GET /jobs/{jid}"][1]["vertices"][0]["id"]
    for what in (
        "watermarks",
        "subtasks/metrics?get=backPressuredTimeMsPerSecond,busyTimeMsPerSecond,numRecordsInPerSecond",
        "backpressure",
        "metrics",
    ):
        record(
            f"GET /jobs/{{jid}}/vertices/{{vid}}/{what}", f"/jobs/{jid}/vertices/{vertex}/{what}"
        )
    target = f"file://{storage}/savepoints"
    trigger = record(
        "POST /jobs/{jid}/savepoints",
        f"/jobs/{jid}/savepoints",
        "POST",
        {"target-directory": target, "cancel-job": False},
    )
    time.sleep(4)
    done = record(
        "GET /jobs/{jid}/savepoints/{triggerid}", f"/jobs/{jid}/savepoints/{trigger['request-id']}"
    )
    record("GET /jobs/{jid}/savepoints/unknown", f"/jobs/{jid}/savepoints/{'0' * 32}")
    record("GET /jobs/{jid}/checkpoints after savepoint", f"/jobs/{jid}/checkpoints")
    location = (done.get("operation") or {}).get("location")
    if location:
        disposal = record(
            "POST /savepoint-disposal", "/savepoint-disposal", "POST", {"savepoint-path": location}
        )
        time.sleep(2)
        record(
            "GET /savepoint-disposal/{triggerid}", f"/savepoint-disposal/{disposal['request-id']}"
        )
    stop = record("POST /jobs/{jid}/stop", f"/jobs/{jid}/stop", "POST", {"targetDirectory": target})
    time.sleep(0.5)
    record(
        "GET /jobs/{jid}/savepoints/{stop triggerid}",
        f"/jobs/{jid}/savepoints/{stop['request-id']}",
    )
    samples = {}
    for name, (status, answer) in answers.items():
        if isinstance(answer, dict) and "errors" in answer:
            answer = {"errors": [e.split("\n")[0] for e in answer["errors"]]}
        samples[name] = {"status": status, "body": answer}
    text = (
        json.dumps(samples, indent=1, sort_keys=True).replace(jid, "{jid}").replace(vertex, "{vid}")
    )
    recorded = {
        "recorded_with": "apache-flink 2.3.0 (PyFlink local MiniCluster), "
        "tests/compat/record_flink_samples.py",
        "jid": "{jid}",
        "responses": json.loads(text),
    }
    OUT.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
