"""One function per command: each reaches what it needs and returns an exit code."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.cli.arguments import (
    DEFAULT_HISTORY_URL,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    OperationFailed,
    reachable,
    say,
    with_topics,
)
from sparkpoint.common.kafka import bootstrap_servers, make_admin

if TYPE_CHECKING:
    from sparkpoint.client import Rest
    from sparkpoint.common.broker import BrokerSecurity
    from sparkpoint.common.rest_security import RestSecurity
    from sparkpoint.coordinator.rest.flink_compat import WebUi


def cmd_broker(args: argparse.Namespace) -> int:
    from sparkpoint.common import secure_broker
    from sparkpoint.common.broker import run_foreground
    from sparkpoint.common.kafka_config import KafkaConfigError

    secured = (args.tls_cert, args.tls_key, args.tls_client_ca, args.sasl_users)
    if args.dev_tls is None and not any(secured):
        say(f"embedded broker (tansu, memory only) on 127.0.0.1:{args.port}")
        run_foreground(args.port)
        return EXIT_OK  # not reached: the process became the broker
    try:
        security = broker_security(args)
    except (KafkaConfigError, OperationFailed, OSError) as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
        return EXIT_USAGE
    secure_broker.serve(args.port, "127.0.0.1", security, say)
    return EXIT_OK


def broker_security(args: argparse.Namespace) -> BrokerSecurity:
    """``sparkpoint broker``'s TLS and SASL: the development setup of ``--dev-tls``, or the
    operator's files; each file checked here, with a message naming it."""
    from sparkpoint.common import secure_broker
    from sparkpoint.common.broker import BrokerSecurity

    if args.dev_tls is not None:
        if any((args.tls_cert, args.tls_key, args.tls_client_ca, args.sasl_users)):
            raise OperationFailed("--dev-tls makes its own certificate and user: give it alone")
        dev = secure_broker.dev_security(args.dev_tls)
        say(f"clients: --kafka-config {dev.client_config} (or SPARKPOINT_KAFKA_CONFIG)")
        return dev.security
    if args.tls_key is not None and args.tls_cert is None:
        raise OperationFailed("--tls-key needs --tls-cert")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
                       ("--tls-client-ca", args.tls_client_ca)):  # fmt: skip
        if path is not None and not path.is_file():
            raise OperationFailed(f"{flag} {path}: no such file")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise OperationFailed("--tls-client-ca needs --tls-cert: client certificates need TLS")
    users = secure_broker.sasl_users(args.sasl_users) if args.sasl_users else {}
    cert = str(args.tls_cert) if args.tls_cert else None
    security = BrokerSecurity(
        cert, str(args.tls_key or args.tls_cert) if cert else None,
        str(args.tls_client_ca) if args.tls_client_ca else None, users,
    )  # fmt: skip
    secure_broker.check_files(security)
    return security


def cmd_topics_create(args: argparse.Namespace) -> int:
    from sparkpoint.common.topics import create_topics, print_topics

    bootstrap = reachable(args.bootstrap)
    states = create_topics(
        make_admin(bootstrap),
        partitions=args.partitions,
        replication_factor=args.replication_factor,
    )
    print_topics(states, say)
    return EXIT_OK


def load_web_ui(path: Path | None) -> WebUi | int | None:
    """Flink's dashboard from ``--flink-web-ui``, None without one, or `EXIT_USAGE` (said on
    stderr) when the path holds none."""
    from sparkpoint.coordinator.rest.flink_compat import WebUi, WebUiError

    try:
        return WebUi.load(path) if path is not None else None
    except (WebUiError, OSError) as exc:
        print(f"sparkpoint: --flink-web-ui: {exc}", file=sys.stderr)
        return EXIT_USAGE


def rest_security(args: argparse.Namespace) -> RestSecurity:
    """The REST endpoint's security from a service's flags (`parser.add_rest_security`)."""
    from sparkpoint.common.rest_security import RestSecurity

    return RestSecurity(
        args.rest_tls_cert,
        args.rest_tls_key,
        args.rest_tls_client_ca,
        args.rest_access_file,
        tuple(args.rest_trusted_proxy or ()),
    )


def cmd_coordinator(args: argparse.Namespace) -> int:
    from sparkpoint.common.rest_security import SecuritySettingsError
    from sparkpoint.coordinator.main import load_security, run
    from sparkpoint.coordinator.service.earlier import TOKEN_ENV as HISTORY_TOKEN_ENV

    web_ui = load_web_ui(args.flink_web_ui)
    if isinstance(web_ui, int):
        return web_ui
    try:  # checked before Kafka is reached: a wrong file is said at once
        security = rest_security(args).over(load_security(args.config))
        security.check()
        if args.history_token_file is not None:
            os.environ[HISTORY_TOKEN_ENV] = read_token(
                args.history_token_file, "--history-token-file"
            )
    except (SecuritySettingsError, OperationFailed) as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run(
        with_topics(reachable(args.bootstrap)),
        args.rest_host,
        args.rest_port,
        args.config,
        args.advertised_rest_url,
        web_ui,
        args.history_url,
        args.transactions_in_flight,
        security,
    )
    return EXIT_OK


def read_token(path: Path, flag: str) -> str:
    """A bearer token from a file (``flag``'s), registered as a secret for the logs."""
    from sparkpoint.common.redaction import register_secrets

    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise OperationFailed(f"{flag} {path}: {exc.strerror}") from None
    if not token:
        raise OperationFailed(f"{flag} {path}: the file holds no token")
    register_secrets([token])
    return token


def cmd_history(args: argparse.Namespace) -> int:
    from sparkpoint.common.rest_security import SecuritySettingsError
    from sparkpoint.history.app import HistorySettings, run

    try:  # checked before Kafka is reached: a wrong file is said at once
        security = rest_security(args)
        security.check()
    except SecuritySettingsError as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = HistorySettings(
        with_topics(reachable(args.bootstrap)),
        args.rest_host,
        args.rest_port,
        args.group,
        args.checkpoint_history,
        security=security,
    )
    run(settings, say)
    return EXIT_OK


def cmd_agent(args: argparse.Namespace) -> int:
    from sparkpoint.agent.spark.session import abandon_launched_driver, launch_driver

    spark_settings = {}
    for setting in args.conf or []:
        key, sep, value = setting.partition("=")
        if not sep or not key.startswith("spark."):
            raise OperationFailed(f"--conf {setting!r}: expected spark.KEY=VALUE")
        spark_settings[key] = value
    bootstrap = with_topics(reachable(args.bootstrap))
    _findable(args.job)
    # the driver's JVM starts while the agent, the job and their libraries are imported
    launch_driver(args.master, spark_settings)
    try:
        return _run_agent(args, bootstrap, spark_settings)
    except BaseException:
        abandon_launched_driver()  # a job that could not start leaves no JVM behind
        raise


def _findable(spec: str) -> None:
    """A job whose file or module is not there fails before Spark starts, in the words loading
    it would use (`load_job` says what else can be wrong, once it runs)."""
    from sparkpoint.agent.job_spec import parse_job_spec

    parsed = parse_job_spec(spec)
    if parsed.in_file:
        if not Path(parsed.target).is_file():
            raise OperationFailed(
                f"cannot load job {spec!r}: job file {parsed.target} does not exist"
            )
        return
    try:
        found = importlib.util.find_spec(parsed.target)
    except (ImportError, ValueError) as exc:  # a parent package missing or failing to import
        raise OperationFailed(f"cannot load job {spec!r}: {exc}") from None
    if found is None:
        raise OperationFailed(f"cannot load job {spec!r}: No module named {parsed.target!r}")


def _run_agent(args: argparse.Namespace, bootstrap: str, spark_settings: dict[str, str]) -> int:
    from sparkpoint.agent.main import AgentFailed, run
    from sparkpoint.agent.rounds.channels import DEFAULT_CAPACITY_BYTES
    from sparkpoint.agent.runtime import AgentOptions
    from sparkpoint.common.events import JobStatus

    options = AgentOptions(
        bootstrap,
        parallelism=args.parallelism,
        restore=args.restore,
        allow_non_restored_state=args.allow_non_restored_state,
        allow_fresh_start=args.allow_fresh_start,
        claim_mode=args.claim_mode,
        master=args.master,
        spark_settings=spark_settings,
        checkpoint_dir=args.checkpoint_dir,
        channel_dir=args.channel_dir,
        capacity_bytes=args.channel_capacity or DEFAULT_CAPACITY_BYTES,
    )
    try:
        status = run(args.job, options, say)
    except AgentFailed as exc:
        raise OperationFailed(str(exc)) from None
    return EXIT_OK if status in (JobStatus.FINISHED, JobStatus.CANCELED) else EXIT_FAILED


def cmd_generate(args: argparse.Namespace) -> int:
    from sparkpoint.agent.example import generate

    bootstrap = reachable(args.bootstrap)
    target = f"{args.count} payments" if args.count else "payments until Ctrl-C"
    say(f"generating {target} on {args.topic}" + (f" at {args.rate}/s" if args.rate else ""))
    written = generate(
        bootstrap, args.topic, args.count, args.rate, args.start_id, args.seed, args.verbose
    )
    say(f"{written} payments written to {args.topic}")
    return EXIT_OK


def coordinator_rest(args: argparse.Namespace) -> Rest:
    """The coordinator a REST command talks to, with its credentials (`parser.rest_command`);
    the token is registered as a secret, so no log line shows it."""
    from sparkpoint.client import Credentials, Rest, rest_url
    from sparkpoint.common.redaction import register_secrets

    token = args.rest_token
    if args.rest_token_file is not None:
        token = read_token(args.rest_token_file, "--rest-token-file")
    credentials = Credentials.from_environment(token, args.rest_ca, args.rest_cert, args.rest_key)
    register_secrets([credentials.token] if credentials.token else [])
    return Rest(rest_url(args.rest), credentials)


def cmd_jobs(args: argparse.Namespace) -> int:
    from sparkpoint.common.flink_ids import flink_job_id

    jobs = coordinator_rest(args).call("GET", "/jobs")["jobs"]
    say(f"{'id':<24} {'Flink JobID':<32} {'status':<10} {'parallelism':>11} {'restarts':>8}  name")
    for job in jobs:
        restarts = job.get("restarts", 0)
        jid = job.get("jid") or flink_job_id(job["id"])  # an older coordinator: derived here
        say(
            f"{job['id']:<24} {jid:<32} {job['status']:<10} {job['parallelism']:>11} {restarts:>8}  {job['name']}"
        )
    return EXIT_OK


def cmd_checkpoints(args: argparse.Namespace) -> int:
    stats = coordinator_rest(args).call("GET", f"/jobs/{args.job}/checkpoints")
    counts = stats["counts"]
    say(
        f"job {args.job}: {counts['completed']} completed, {counts['failed']} failed, "
        f"{counts['in_progress']} in progress, {counts['restored']} restored"
    )
    duration = stats["summary"]["end_to_end_duration"]
    say(
        f"duration ms: min {duration['min']} avg {duration['avg']} p50 {duration['p50']:.0f} p99 {duration['p99']:.0f} max {duration['max']}"
    )
    say(
        f"{'id':>6}  {'status':<11} {'type':<20} {'duration':>9} {'state':>10} {'acks':>7}  path or failure"
    )
    for entry in stats["history"]:
        where = entry.get("external_path") or entry.get("failure_message") or ""
        acks = f"{entry['num_acknowledged_subtasks']}/{entry['num_subtasks']}"
        say(
            f"{entry['id']:>6}  {entry['status']:<11} {entry['checkpoint_type']:<20} {entry['end_to_end_duration']:>7}ms {entry['state_size']:>10} {acks:>7}  {where}"
        )
    latest = next(
        (e for e in stats["history"] if e["status"] == "COMPLETED" and e.get("external_path")),
        None,
    )
    if latest is not None:
        watermark = stored_watermark(latest["external_path"])
        if watermark is not None:
            say(f"watermark stored by checkpoint {latest['id']}: {describe_watermark(watermark)}")
    return EXIT_OK


def stored_watermark(directory: str) -> int | None:
    """The lowest keyed subtask's watermark a checkpoint or savepoint stored (its
    ``source-<i>.json`` files): what a restore starts from. None when it stored none (a job
    without event time) or its storage cannot be read from here."""
    import json
    import posixpath

    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(directory)
        values = []
        for path in fs.glob(posixpath.join(root, "source-*.json")):
            with fs.open(path, "rb") as file:
                data = json.loads(file.read())
            watermark = data.get("watermark") if isinstance(data, dict) else None
            if isinstance(watermark, dict) and isinstance(watermark.get("value"), int):
                values.append(int(watermark["value"]))
    except (OSError, ValueError, ImportError):
        return None
    return min(values) if values else None


def describe_watermark(value: int) -> str:
    """A watermark as a user reads it: the time it stands for, or Flink's bounds by name."""
    from datetime import UTC, datetime

    if value <= -(2**63):
        return "none yet (Long.MIN_VALUE)"
    if value >= 2**63 - 1:
        return "end of input (Long.MAX_VALUE)"
    moment = datetime.fromtimestamp(value / 1000, tz=UTC)
    return f"{value} ({moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


def cmd_checkpoint(args: argparse.Namespace) -> int:
    rest = coordinator_rest(args)
    request_id = rest.call("POST", f"/jobs/{args.job}/checkpoints", {})["request-id"]
    operation = rest.wait_for_trigger(f"/jobs/{args.job}/checkpoints/{request_id}", args.timeout)
    details = rest.call("GET", f"/jobs/{args.job}/checkpoints/details/{operation['checkpointId']}")
    say(details.get("external_path") or str(operation["checkpointId"]))
    return EXIT_OK


def cmd_savepoint(args: argparse.Namespace) -> int:
    rest = coordinator_rest(args)
    if args.dispose:
        if args.job or args.target_dir:
            raise OperationFailed("--dispose PATH takes no JOB or TARGET_DIR")
        answer = rest.call("POST", "/savepoint-disposal", {"savepoint-path": args.dispose})
        operation = answer.get("operation")
        if operation is None:
            operation = rest.wait_for_trigger(
                f"/savepoint-disposal/{answer['request-id']}", args.timeout
            )
        if "failure-cause" in operation:
            raise OperationFailed(f"disposing {args.dispose} failed: {operation['failure-cause']}")
        say(f"disposed savepoint {args.dispose}")
        return EXIT_OK
    if not args.job:
        raise OperationFailed("a JOB is needed (or --dispose PATH)")
    body = {
        "target-directory": args.target_dir,
        "cancel-job": False,
        "formatType": args.type.upper(),
    }
    request_id = rest.call("POST", f"/jobs/{args.job}/savepoints", body)["request-id"]
    say(
        rest.wait_for_trigger(f"/jobs/{args.job}/savepoints/{request_id}", args.timeout)["location"]
    )
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    rest = coordinator_rest(args)
    body = {"targetDirectory": args.savepoint, "drain": args.drain, "formatType": args.type.upper()}
    request_id = rest.call("POST", f"/jobs/{args.job}/stop", body)["request-id"]
    say(
        rest.wait_for_trigger(f"/jobs/{args.job}/savepoints/{request_id}", args.timeout)["location"]
    )
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """As ``flink cancel``: the agent ends the job CANCELED (no savepoint)."""
    coordinator_rest(args).call("PATCH", f"/jobs/{args.job}?mode=cancel")
    say(f"cancelled job {args.job}: its agent ends it CANCELED at the end of its current round")
    return EXIT_OK


CONFIG_OPTIONS = {
    "interval": ("checkpointInterval", "duration"),
    "timeout": ("checkpointTimeout", "duration"),
    "min_pause": ("minPauseBetweenCheckpoints", "duration"),
    "max_concurrent": ("maxConcurrentCheckpoints", "int"),
    "tolerable_failed": ("tolerableCheckpointFailureNumber", "int"),
    "aligned_timeout": ("alignedCheckpointTimeout", "duration"),
    "unaligned": ("unalignedCheckpoints", "switch"),
}


def cmd_config(args: argparse.Namespace) -> int:
    rest = coordinator_rest(args)
    changes = {
        rest: getattr(args, name)
        for name, (rest, _) in CONFIG_OPTIONS.items()
        if getattr(args, name) is not None
    }
    if changes:
        config = rest.call("PATCH", f"/jobs/{args.job}/checkpoints/configuration", changes)
    else:
        config = rest.call("GET", f"/jobs/{args.job}/checkpoints/config")
    for key, value in config.items():
        say(f"{key}: {json.dumps(value)}")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    from sparkpoint import audit
    from sparkpoint.client import Credentials
    from sparkpoint.common.redaction import register_secrets
    from sparkpoint.coordinator.service.earlier import TOKEN_ENV as HISTORY_TOKEN_ENV

    history_url = args.history or os.environ.get("SPARKPOINT_HISTORY_URL", DEFAULT_HISTORY_URL)
    token = os.environ.get(HISTORY_TOKEN_ENV, "").strip() or None
    if args.history_token_file is not None:
        token = read_token(args.history_token_file, "--history-token-file")
    register_secrets([token] if token else [])
    credentials = Credentials(token, args.history_ca, args.history_cert, args.history_key)
    try:
        told = False
        if not args.replay:
            try:
                if audit.history_answers(history_url, credentials):
                    audit.run(bootstrap_servers(args.bootstrap), args.job, args.since, args.json,
                              say, history_url, credentials)  # fmt: skip
                    told = True
            except audit.HistoryUnreadable as exc:
                if args.history is not None:  # asked for by name: fix what it says, then retry
                    raise OperationFailed(str(exc)) from None
                print(f"sparkpoint: {exc}; replaying the topics instead", file=sys.stderr)
        if not told:
            audit.run(reachable(args.bootstrap), args.job, args.since, args.json, say)
        if args.follow:
            audit.follow(reachable(args.bootstrap), args.job, args.json, say)
    except ValueError as exc:
        raise OperationFailed(str(exc)) from None
    except KeyboardInterrupt:
        pass  # how --follow ends
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from sparkpoint import demo

    if isinstance(load_web_ui(args.flink_web_ui), int):  # checked here: the coordinator
        return EXIT_USAGE  # runs as a process of its own
    if args.secure and args.bootstrap:
        print(
            "sparkpoint: --secure secures the embedded broker; for your own Kafka give "
            "--kafka-config",
            file=sys.stderr,
        )
        return EXIT_USAGE
    demo.run(
        reachable(args.bootstrap) if args.bootstrap else None,
        args.partitions,
        args.once,
        say,
        args.rest_port,
        args.exchange,
        args.flink_web_ui,
        args.secure,
    )
    return EXIT_OK
