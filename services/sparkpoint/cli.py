"""The `sparkpoint` command: thin, it parses arguments and calls into the services.

Exit status: 0 on success, 1 on a failed operation, 2 on bad usage; errors go to stderr as one
readable line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from sparkpoint.client import RestError
from sparkpoint.common.broker import BrokerError, wait_for_metadata
from sparkpoint.common.kafka import bootstrap_servers, make_admin
from sparkpoint.common.options import parse_memory
from sparkpoint.common.settings import ConfigError
from sparkpoint.common.topics import DEFAULT_PARTITIONS, TopicMismatch

if TYPE_CHECKING:
    from sparkpoint.coordinator.rest.flink_compat import WebUi

DEFAULT_HISTORY_URL = "http://127.0.0.1:8082"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class OperationFailed(Exception):
    """A command could not do what it was asked; the message is printed as the one error line."""


def say(line: str) -> None:
    print(line, flush=True)


def whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def memory_size(text: str) -> int:
    try:
        size = parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return size


def non_negative_int(text: str) -> int:
    return whole_number(text, 0)


def on_off(text: str) -> bool:
    choices = {"on": True, "true": True, "off": False, "false": False}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return choices[text.lower()]


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


REACH_TIMEOUT_S = 10.0
"""How long a command waits for Kafka to answer before it says it cannot reach it."""


def with_topics(servers: str) -> str:
    """The servers, once the broker is known to have every sparkpoint topic."""
    from confluent_kafka import KafkaException

    from sparkpoint.common.kafka import make_admin
    from sparkpoint.common.topics import missing_topics

    try:
        missing = missing_topics(make_admin(servers))
    except KafkaException:  # slow to answer now: the command itself waits for the broker
        return servers
    if missing:
        raise OperationFailed(
            f"Kafka at {servers} lacks the sparkpoint topics {', '.join(missing)}: create them "
            f"first with `sparkpoint topics create --bootstrap {servers}`"
        )
    return servers


def reachable(bootstrap: str | None) -> str:
    """The bootstrap servers to use, once they answered a metadata request."""
    servers = bootstrap_servers(bootstrap)
    try:
        wait_for_metadata(servers, REACH_TIMEOUT_S)
    except BrokerError:
        raise OperationFailed(
            f"cannot reach Kafka at {servers} (is a broker running? `sparkpoint broker`, "
            "or set --bootstrap / KAFKA_BOOTSTRAP_SERVERS)"
        ) from None
    return servers


def duration_ms(text: str) -> int:
    from sparkpoint.common.settings import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)",
    )


def cmd_broker(args: argparse.Namespace) -> int:
    from sparkpoint.common.broker import run_foreground

    say(f"embedded broker (tansu, memory only) on 127.0.0.1:{args.port}")
    run_foreground(args.port)
    return EXIT_OK  # not reached: the process became the broker


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


def cmd_coordinator(args: argparse.Namespace) -> int:
    from sparkpoint.coordinator.main import run

    web_ui = load_web_ui(args.flink_web_ui)
    if isinstance(web_ui, int):
        return web_ui
    run(
        with_topics(reachable(args.bootstrap)),
        args.rest_host,
        args.rest_port,
        args.config,
        args.advertised_rest_url,
        web_ui,
        args.history_url,
        args.transactions_in_flight,
    )
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    from sparkpoint.history.app import HistorySettings, run

    settings = HistorySettings(
        with_topics(reachable(args.bootstrap)),
        args.rest_host,
        args.rest_port,
        args.group,
        args.checkpoint_history,
    )
    run(settings, say)
    return EXIT_OK


def cmd_agent(args: argparse.Namespace) -> int:
    from sparkpoint.agent.main import AgentFailed, run
    from sparkpoint.agent.rounds.channels import DEFAULT_CAPACITY_BYTES
    from sparkpoint.agent.runtime import AgentOptions
    from sparkpoint.common.events import JobStatus

    spark_settings = {}
    for setting in args.conf or []:
        key, sep, value = setting.partition("=")
        if not sep or not key.startswith("spark."):
            raise OperationFailed(f"--conf {setting!r}: expected spark.KEY=VALUE")
        spark_settings[key] = value
    options = AgentOptions(
        with_topics(reachable(args.bootstrap)),
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


def cmd_jobs(args: argparse.Namespace) -> int:
    from sparkpoint.client import call, rest_url
    from sparkpoint.common.flink_ids import flink_job_id

    jobs = call(rest_url(args.rest), "GET", "/jobs")["jobs"]
    say(f"{'id':<24} {'Flink JobID':<32} {'status':<10} {'parallelism':>11} {'restarts':>8}  name")
    for job in jobs:
        restarts = job.get("restarts", 0)
        jid = job.get("jid") or flink_job_id(job["id"])  # an older coordinator: derived here
        say(
            f"{job['id']:<24} {jid:<32} {job['status']:<10} {job['parallelism']:>11} {restarts:>8}  {job['name']}"
        )
    return EXIT_OK


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from sparkpoint.client import call, rest_url

    stats = call(rest_url(args.rest), "GET", f"/jobs/{args.job}/checkpoints")
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
    return EXIT_OK


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from sparkpoint.client import call, rest_url, wait_for_trigger

    base = rest_url(args.rest)
    request_id = call(base, "POST", f"/jobs/{args.job}/checkpoints", {})["request-id"]
    operation = wait_for_trigger(base, f"/jobs/{args.job}/checkpoints/{request_id}", args.timeout)
    details = call(base, "GET", f"/jobs/{args.job}/checkpoints/details/{operation['checkpointId']}")
    say(details.get("external_path") or str(operation["checkpointId"]))
    return EXIT_OK


def cmd_savepoint(args: argparse.Namespace) -> int:
    from sparkpoint.client import call, rest_url, wait_for_trigger

    base = rest_url(args.rest)
    if args.dispose:
        if args.job or args.target_dir:
            raise OperationFailed("--dispose PATH takes no JOB or TARGET_DIR")
        answer = call(base, "POST", "/savepoint-disposal", {"savepoint-path": args.dispose})
        operation = answer.get("operation")
        if operation is None:
            operation = wait_for_trigger(
                base, f"/savepoint-disposal/{answer['request-id']}", args.timeout
            )
        if "failure-cause" in operation:
            raise OperationFailed(f"disposing {args.dispose} failed: {operation['failure-cause']}")
        say(f"disposed savepoint {args.dispose}")
        return EXIT_OK
    if not args.job:
        raise OperationFailed("a JOB is needed (or --dispose PATH)")
    body = {"target-directory": args.target_dir, "cancel-job": False}
    request_id = call(base, "POST", f"/jobs/{args.job}/savepoints", body)["request-id"]
    say(
        wait_for_trigger(base, f"/jobs/{args.job}/savepoints/{request_id}", args.timeout)[
            "location"
        ]
    )
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from sparkpoint.client import call, rest_url, wait_for_trigger

    base = rest_url(args.rest)
    body = {"targetDirectory": args.savepoint, "drain": args.drain}
    request_id = call(base, "POST", f"/jobs/{args.job}/stop", body)["request-id"]
    say(
        wait_for_trigger(base, f"/jobs/{args.job}/savepoints/{request_id}", args.timeout)[
            "location"
        ]
    )
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """As ``flink cancel``: the agent ends the job CANCELED (no savepoint)."""
    from sparkpoint.client import call, rest_url

    call(rest_url(args.rest), "PATCH", f"/jobs/{args.job}?mode=cancel")
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
    from sparkpoint.client import call, rest_url

    base = rest_url(args.rest)
    changes = {
        rest: getattr(args, name)
        for name, (rest, _) in CONFIG_OPTIONS.items()
        if getattr(args, name) is not None
    }
    if changes:
        config = call(base, "PATCH", f"/jobs/{args.job}/checkpoints/configuration", changes)
    else:
        config = call(base, "GET", f"/jobs/{args.job}/checkpoints/config")
    for key, value in config.items():
        say(f"{key}: {json.dumps(value)}")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    from sparkpoint import audit

    history_url = args.history or os.environ.get("SPARKPOINT_HISTORY_URL", DEFAULT_HISTORY_URL)
    try:
        if not args.replay and audit.history_answers(history_url):
            audit.run(bootstrap_servers(args.bootstrap), args.job, args.since, args.json, say,
                      history_url)  # fmt: skip
        else:
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
    demo.run(
        reachable(args.bootstrap) if args.bootstrap else None,
        args.partitions,
        args.once,
        say,
        args.rest_port,
        args.exchange,
        args.flink_web_ui,
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkpoint",
        description="Flink-grade checkpointing for Spark pipelines, coordinated over Kafka.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        add_broker_commands, add_coordinator_command, add_history_command, add_agent_command,
        add_generate_command, add_job_commands, add_config_command, add_audit_command,
        add_demo_command,
    ):  # fmt: skip
        add(commands)
    return parser


def add_broker_commands(commands: Any) -> None:
    """``broker`` and ``topics create``."""
    broker = commands.add_parser(
        "broker", help="run the embedded Kafka-protocol broker in the foreground"
    )
    broker.add_argument("--port", type=port_number, default=9092)
    broker.set_defaults(run=cmd_broker)

    topics = commands.add_parser("topics", help="manage sparkpoint topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", help="create every sparkpoint topic; idempotent")
    add_bootstrap(create)
    create.add_argument("--partitions", type=positive_int, default=DEFAULT_PARTITIONS)
    create.add_argument(
        "--replication-factor", type=int, default=-1, help="default: the broker's default"
    )
    create.set_defaults(run=cmd_topics_create)


def add_coordinator_command(commands: Any) -> None:
    """``coordinator``."""
    coordinator = commands.add_parser("coordinator", help="run a coordinator instance")
    add_bootstrap(coordinator)
    coordinator.add_argument("--rest-host", default="127.0.0.1")
    coordinator.add_argument("--rest-port", type=port_number, default=8081)
    coordinator.add_argument(
        "--config", type=Path, help="YAML with cluster-wide execution.checkpointing.* defaults"
    )
    coordinator.add_argument(
        "--advertised-rest-url",
        help="the URL other instances redirect to (default: from --rest-host)",
    )
    coordinator.add_argument(
        "--flink-web-ui",
        type=Path,
        metavar="PATH",
        help="serve Flink's web dashboard at /flink/ from a flink-dist jar "
        "(pyflink/lib/flink-dist-*.jar) or its unpacked web/ folder",
    )
    coordinator.add_argument(
        "--history-url",
        metavar="URL",
        help="the history service (sparkpoint history): checkpoint statistics from before this "
        "instance owned a job are added from it",
    )
    coordinator.add_argument(
        "--transactions-in-flight",
        type=positive_int,
        default=1,
        metavar="N",
        help="how many of this instance's partitions may have a transaction open at once; the "
        "others wait their turn and commit what queued meanwhile together (default 1: on the "
        "embedded broker concurrent transactions slow each other down)",
    )
    coordinator.set_defaults(run=cmd_coordinator)


def add_history_command(commands: Any) -> None:
    """``history``."""
    history = commands.add_parser(
        "history", help="run the history service: every job's history, kept across failovers"
    )
    add_bootstrap(history)
    history.add_argument("--rest-host", default="127.0.0.1")
    history.add_argument("--rest-port", type=port_number, default=8082)
    history.add_argument(
        "--group", help="consumer group and table prefix (default: <topic prefix>history)"
    )
    history.add_argument(
        "--checkpoint-history",
        type=positive_int,
        default=50,
        help="checkpoints listed in detail per job (min/max/avg count them all)",
    )
    history.set_defaults(run=cmd_history)


def add_agent_command(commands: Any) -> None:
    """``agent``."""
    agent = commands.add_parser(
        "agent", help="run the agent of a job (module:attribute, a .py file, or `example`)"
    )
    add_bootstrap(agent)
    agent.add_argument("job", metavar="JOB")
    agent.add_argument("--parallelism", type=positive_int, help="default: the job's")
    agent.add_argument(
        "--restore", metavar="PATH|latest", help="a checkpoint or savepoint directory, or latest"
    )
    agent.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="drop snapshot state the job cannot map (source topics it no longer reads)",
    )
    agent.add_argument(
        "--allow-fresh-start",
        action="store_true",
        help="with --restore latest: start from the beginning of the input when the job's "
        "checkpoints were discarded at its end (otherwise that is refused)",
    )
    agent.add_argument(
        "--claim-mode",
        choices=["CLAIM", "NO_CLAIM"],
        help="execution.state-recovery.claim-mode for --restore PATH (default NO_CLAIM: the "
        "snapshot is never touched; CLAIM: the job owns it, retention may delete it)",
    )
    agent.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    agent.add_argument(
        "--conf", action="append", metavar="spark.KEY=VALUE", help="a Spark setting (repeatable)"
    )
    agent.add_argument(
        "--checkpoint-dir",
        help="execution.checkpointing.dir (default: the job's, else ./.sparkpoint/checkpoints)",
    )
    agent.add_argument(
        "--channel-dir",
        metavar="PATH|URL",
        help="where stage-1 tasks write the segment files stage 2 reads (every executor must "
        "reach it; default: local disk on a local master, the checkpoint storage otherwise)",
    )
    agent.add_argument(
        "--channel-capacity",
        type=memory_size,
        metavar="SIZE",
        help="queued segment bytes per channel above which the source stops reading "
        "(backpressure), and the room restored channel state enters a channel through "
        "(default 256mb; e.g. 64kb, 1gb)",
    )
    agent.set_defaults(run=cmd_agent)


def add_generate_command(commands: Any) -> None:
    """``generate``."""
    generate = commands.add_parser("generate", help="write the example job's input events")
    add_bootstrap(generate)
    generate.add_argument(
        "--rate", type=positive_int, help="events per second (default: as fast as possible)"
    )
    generate.add_argument("--count", type=positive_int, help="how many (default: until Ctrl-C)")
    generate.add_argument("--topic", default="payments")
    generate.add_argument("--start-id", type=non_negative_int, default=0)
    generate.add_argument("--seed", type=int, default=7)
    generate.set_defaults(run=cmd_generate)


def rest_command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A command that talks to a coordinator's REST API (``--rest``)."""
    command: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
    command.add_argument(
        "--rest",
        help="coordinator REST address (default: $SPARKPOINT_REST, else http://127.0.0.1:8081)",
    )
    return command


def add_job_commands(commands: Any) -> None:
    """The commands that operate a job through REST."""
    rest_command(commands, "jobs", "list jobs with their status").set_defaults(run=cmd_jobs)
    cancel = rest_command(commands, "cancel", "cancel a job (as flink cancel): it ends CANCELED")
    cancel.add_argument("job")
    cancel.set_defaults(run=cmd_cancel)
    checkpoints = rest_command(
        commands, "checkpoints", "history and summary of a job's checkpoints"
    )
    checkpoints.add_argument("job")
    checkpoints.set_defaults(run=cmd_checkpoints)
    for name, help_text, handler in (
        ("checkpoint", "trigger a checkpoint now, wait, print its path", cmd_checkpoint),
        ("savepoint", "trigger a savepoint, wait, print its path", cmd_savepoint),
        ("stop", "stop the job with a savepoint, print its path", cmd_stop),
    ):
        command = rest_command(commands, name, help_text)
        command.add_argument("job", nargs="?" if name == "savepoint" else None)
        if name == "savepoint":
            command.add_argument("target_dir", nargs="?", metavar="TARGET_DIR")
            command.add_argument(
                "--dispose",
                metavar="PATH",
                help="delete the savepoint at PATH instead (as flink savepoint -d)",
            )
        if name == "stop":
            command.add_argument("--savepoint", metavar="TARGET_DIR")
            command.add_argument(
                "--drain",
                action="store_true",
                help="end the input first: everything read is processed and windows fire "
                "(as flink stop --drain); the job is not meant to be resumed from it",
            )
        command.add_argument(
            "--timeout", type=float, default=600.0, help="seconds to wait (default 600)"
        )
        command.set_defaults(run=handler)


def add_config_command(commands: Any) -> None:
    """``config``: show or change a job's checkpoint configuration."""
    config = rest_command(
        commands, "config", "show, or with options change, a job's checkpoint configuration"
    )
    config.add_argument("job")
    for name, (rest, kind) in CONFIG_OPTIONS.items():
        config.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type={"duration": duration_ms, "switch": on_off}.get(kind, non_negative_int),
            help=f"sets {rest}"
            + {"duration": " (500ms, 30s, 10min)", "switch": " (on or off)"}.get(kind, ""),
        )
    config.set_defaults(run=cmd_config)


def add_audit_command(commands: Any) -> None:
    """``audit``."""
    audit = commands.add_parser(
        "audit", help="replay the audit topics: config changes, checkpoint fates"
    )
    add_bootstrap(audit)
    audit.add_argument("job", nargs="?")
    audit.add_argument("--since", help="a duration ago (10min) or an ISO time")
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    audit.add_argument(
        "--history",
        metavar="URL",
        help="the history service to read from (default: $SPARKPOINT_HISTORY_URL, else "
        f"{DEFAULT_HISTORY_URL}); the topics are replayed when it does not answer",
    )
    audit.add_argument(
        "--replay", action="store_true", help="replay every event from the topics instead"
    )
    audit.add_argument(
        "--follow",
        action="store_true",
        help="then go on printing events as they are written, until Ctrl-C",
    )
    audit.set_defaults(run=cmd_audit)


def add_demo_command(commands: Any) -> None:
    """``demo``."""
    demo = commands.add_parser("demo", help="what `make run` runs: everything embedded")
    add_bootstrap(demo)
    demo.add_argument("--partitions", type=positive_int, default=DEFAULT_PARTITIONS)
    demo.add_argument("--rest-port", type=port_number, default=8081)
    demo.add_argument(
        "--once",
        action="store_true",
        help="stop after three completed checkpoints and committed output (exit 1 if none comes)",
    )
    demo.add_argument(
        "--flink-web-ui",
        type=Path,
        metavar="PATH",
        help="the coordinator also serves Flink's web dashboard at /flink/ (a flink-dist jar or "
        "its web/ folder)",
    )
    demo.add_argument(
        "--exchange",
        action="store_true",
        help="instead of the pipeline: a scripted exchange of every event type",
    )
    demo.set_defaults(run=cmd_demo)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("sparkpoint.librdkafka").setLevel(logging.CRITICAL)
    try:
        code: int = args.run(args)
        return code
    except (OperationFailed, BrokerError, TopicMismatch, ConfigError) as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
    except RestError as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
    except KafkaException as exc:
        print(f"sparkpoint: Kafka: {exc.args[0].str()}", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_FAILED
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
