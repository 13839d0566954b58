"""The command line: one function adds each command with its arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sparkpoint.cli.arguments import (
    DEFAULT_HISTORY_URL,
    add_bootstrap,
    duration_ms,
    memory_size,
    non_negative_int,
    on_off,
    port_number,
    positive_int,
)
from sparkpoint.cli.commands import (
    CONFIG_OPTIONS,
    cmd_agent,
    cmd_audit,
    cmd_broker,
    cmd_cancel,
    cmd_checkpoint,
    cmd_checkpoints,
    cmd_config,
    cmd_coordinator,
    cmd_demo,
    cmd_generate,
    cmd_history,
    cmd_jobs,
    cmd_savepoint,
    cmd_stop,
    cmd_topics_create,
)
from sparkpoint.common.topics import DEFAULT_PARTITIONS


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
    secured = broker.add_argument_group(
        "TLS and SASL",
        "a front before tansu terminates TLS and authenticates clients (docs/security.md)",
    )
    secured.add_argument(
        "--dev-tls",
        type=Path,
        metavar="DIR",
        help="development only: a throwaway CA and certificate, a SCRAM-SHA-512 user sparkpoint "
        "and DIR/client.properties for --kafka-config, made in DIR once and reused",
    )
    secured.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve TLS with this")
    secured.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="its unencrypted key (default: in --tls-cert)"
    )
    secured.add_argument(
        "--tls-client-ca", type=Path, metavar="PEM", help="require client certificates it signed"
    )
    secured.add_argument(
        "--sasl-users",
        type=Path,
        metavar="FILE",
        help="name=password lines (${env:NAME} allowed): PLAIN and SCRAM-SHA-256/512 users",
    )
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
        "--history-token-file",
        type=Path,
        metavar="FILE",
        help="a bearer token with the read role the secured history service admits "
        "(default: $SPARKPOINT_HISTORY_TOKEN)",
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
    add_rest_security(coordinator)
    coordinator.set_defaults(run=cmd_coordinator)


def rest_proxy(text: str) -> object:
    """A trusted proxy's address or network (``--rest-trusted-proxy``)."""
    from sparkpoint.common.rest_security import SecuritySettingsError, proxy_network

    try:
        return proxy_network(text)
    except SecuritySettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_rest_security(service: argparse.ArgumentParser) -> None:
    """The REST endpoint's TLS and authentication (docs/security.md); each also a key of the
    service's YAML configuration, which a flag overrides."""
    group = service.add_argument_group(
        "REST security", "TLS, mutual TLS and bearer tokens for the REST API (docs/security.md)"
    )
    group.add_argument(
        "--rest-tls-cert",
        type=Path,
        metavar="PEM",
        help="serve https with this certificate (chain) (security.ssl.rest.certificate)",
    )
    group.add_argument(
        "--rest-tls-key",
        type=Path,
        metavar="PEM",
        help="the certificate's unencrypted private key (security.ssl.rest.private-key)",
    )
    group.add_argument(
        "--rest-tls-client-ca",
        type=Path,
        metavar="PEM",
        help="mutual TLS: every client presents a certificate one of these CAs signed; its "
        "subject CN is the principal (security.ssl.rest.client-ca)",
    )
    group.add_argument(
        "--rest-access-file",
        type=Path,
        metavar="FILE",
        help="YAML or JSON: bearer tokens (their SHA-256) and client certificates, each with a "
        "role, read or operate; read again when it changes (security.rest.access-file)",
    )
    group.add_argument(
        "--rest-trusted-proxy",
        action="append",
        type=rest_proxy,
        metavar="ADDRESS",
        help="an address or network (repeatable) whose X-Sparkpoint-Principal header is believed "
        "as the audited principal (security.rest.trusted-proxies)",
    )


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
    add_rest_security(history)  # the coordinator's flags; every GET but / and /history/status
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
    """A command that talks to a coordinator's REST API (``--rest``), secured or not."""
    command: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
    command.add_argument(
        "--rest",
        help="coordinator REST address (default: $SPARKPOINT_REST, else http://127.0.0.1:8081)",
    )
    credentials = command.add_argument_group(
        "a secured coordinator", "credentials and trust for https (docs/security.md)"
    )
    token = credentials.add_mutually_exclusive_group()
    token.add_argument(
        "--rest-token",
        metavar="TOKEN",
        help="bearer token (default: $SPARKPOINT_REST_TOKEN; other users of the machine may "
        "see a command line: prefer the variable or --rest-token-file)",
    )
    token.add_argument(
        "--rest-token-file", type=Path, metavar="FILE", help="read the bearer token from FILE"
    )
    credentials.add_argument(
        "--rest-ca",
        type=Path,
        metavar="PEM",
        help="CA certificates to trust for https (default: $SPARKPOINT_REST_CA, else the system's)",
    )
    credentials.add_argument(
        "--rest-cert",
        type=Path,
        metavar="PEM",
        help="client certificate for mutual TLS (default: $SPARKPOINT_REST_CERT)",
    )
    credentials.add_argument(
        "--rest-key",
        type=Path,
        metavar="PEM",
        help="its private key, if not in the certificate's file (default: $SPARKPOINT_REST_KEY)",
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
        if name in ("savepoint", "stop"):
            command.add_argument(
                "--type",
                choices=("canonical", "native"),
                default="canonical",
                help="the savepoint's format (as flink savepoint --type): canonical, every key "
                "group's state in one file (default), or native, the state backend's files",
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
        f"{DEFAULT_HISTORY_URL}); the topics are replayed when it does not answer, or when the "
        "default one refuses (said on stderr); refused by the one named here, audit fails",
    )
    credentials = audit.add_argument_group(
        "a secured history service", "credentials and trust for it (docs/security.md)"
    )
    credentials.add_argument(
        "--history-token-file",
        type=Path,
        metavar="FILE",
        help="a bearer token with the read role (default: $SPARKPOINT_HISTORY_TOKEN)",
    )
    credentials.add_argument(
        "--history-ca",
        type=Path,
        metavar="PEM",
        help="CA certificates to trust for https (default: the system's)",
    )
    credentials.add_argument(
        "--history-cert", type=Path, metavar="PEM", help="client certificate for mutual TLS"
    )
    credentials.add_argument(
        "--history-key",
        type=Path,
        metavar="PEM",
        help="its private key, if not in the certificate's file",
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
    demo.add_argument(
        "--secure",
        action="store_true",
        help="the embedded broker with TLS and SCRAM-SHA-512 (a development CA and user kept in "
        ".sparkpoint/secure), every process reaching it through its client.properties",
    )
    demo.set_defaults(run=cmd_demo)
