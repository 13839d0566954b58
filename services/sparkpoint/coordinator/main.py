"""`sparkpoint coordinator`: the service and its REST API on one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import signal
import socket
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from sparkpoint.common.redaction import install_log_redaction
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.storage import absolute
from sparkpoint.coordinator.rest.app import create_app
from sparkpoint.coordinator.rest.flink_compat import WebUi
from sparkpoint.coordinator.service.instance import CoordinatorService, ServiceSettings

log = logging.getLogger(__name__)


def load_options(config_file: Path | None) -> dict[str, object]:
    """The options of a Flink-style YAML file, keys flat or nested (``{}`` without a file)."""
    if config_file is None:
        return {}
    import yaml

    loaded = yaml.safe_load(config_file.read_text()) or {}
    return _flatten(loaded)


def load_defaults(config_file: Path | None) -> CheckpointConfig:
    """Cluster defaults from a Flink-style YAML file (``execution.checkpointing.*`` keys, flat or
    nested), over Flink's defaults."""
    return CheckpointConfig.from_options(load_options(config_file))


def load_security(config_file: Path | None) -> RestSecurity:
    """The REST endpoint's security from the same file (``security.ssl.rest.*``,
    ``security.rest.*``: `sparkpoint.common.rest_security.settings`)."""
    return RestSecurity.from_options(load_options(config_file), str(config_file))


def _flatten(tree: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
"""The loggers uvicorn's logging configuration gives handlers of their own (``uvicorn`` and
``uvicorn.access`` do not propagate to the root's, where the command put the redaction)."""


def uvicorn_config(app: ASGIApp, host: str, port: int, security: RestSecurity) -> uvicorn.Config:
    """uvicorn's configuration of the REST endpoint. Building it installs uvicorn's logging
    handlers (``dictConfig``): the redaction filter is then added to them, so what uvicorn logs
    (an application's traceback, say) is scrubbed of secrets as every other record is."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        **security.uvicorn_options(),
    )
    for name in UVICORN_LOGGERS:
        install_log_redaction(logging.getLogger(name))
    return config


async def serve(
    service: CoordinatorService,
    rest_host: str,
    rest_port: int,
    web_ui: WebUi | None = None,
    security: RestSecurity | None = None,
) -> None:
    settings = service.settings
    security = security or RestSecurity()
    app = create_app(service, web_ui, security)
    server = uvicorn.Server(uvicorn_config(app, rest_host, rest_port, security))

    def shut_down() -> None:
        service.stop()
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(
            NotImplementedError, RuntimeError
        ):  # RuntimeError: not the main thread
            loop.add_signal_handler(sig, shut_down)
    log.info(
        "coordinator %s: REST on %s://%s:%d", settings.instance_id, security.scheme, rest_host,
        rest_port,
    )  # fmt: skip
    # _serve, not serve: the loop's signal handlers above stop both the service and the server.
    api = asyncio.create_task(server._serve())
    try:
        await service.run()
    finally:
        server.should_exit = True
        await api


GC_THRESHOLDS = (20_000, 20, 20)
"""Python's cyclic collector runs its youngest generation every 20,000 container allocations (the
default is 700) and the older ones after 20 collections of the one below. The coordinator
allocates a few dozen short-lived containers per event and keeps every owned job's state: at
the default thresholds the collector took 14-15% of its CPU at 1,000 checkpoints a second
(perf), walking the same surviving objects over and over. Nothing in the coordinator relies on
cycles being collected promptly; they still are, only in larger batches."""


def tune_collector() -> None:
    """Moves everything loaded so far (modules, schemas, compiled codecs) out of the collector's
    sight (`gc.freeze`) and collects in larger batches (`GC_THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def advertised_url(
    rest_host: str, rest_port: int, explicit: str | None, scheme: str = "http"
) -> str:
    """Where other instances send requests for this instance's jobs: ``--advertised-rest-url``,
    else the bind address, else (bound to every interface) this host's name; ``scheme``:
    https when the endpoint serves TLS."""
    if explicit:
        return explicit.rstrip("/")
    host = socket.gethostname() if rest_host in ("0.0.0.0", "::", "") else rest_host
    return f"{scheme}://{host}:{rest_port}"


def run(
    bootstrap: str,
    rest_host: str,
    rest_port: int,
    config_file: Path | None,
    advertised: str | None = None,
    web_ui: WebUi | None = None,
    history_url: str | None = None,
    transactions_in_flight: int = 1,
    security: RestSecurity | None = None,
) -> None:
    """``security``: the REST endpoint's, already merged over ``config_file``'s and checked
    (`sparkpoint coordinator` does both before it reaches Kafka)."""
    security = security or RestSecurity()
    defaults = load_defaults(config_file)
    defaults = dataclasses.replace(
        defaults,
        checkpoint_dir=absolute(defaults.checkpoint_dir),
        savepoint_dir=absolute(defaults.savepoint_dir),
    )
    settings = ServiceSettings(
        bootstrap,
        defaults,
        rest_url=advertised_url(rest_host, rest_port, advertised, security.scheme),
        history_url=history_url,
        transactions_in_flight=transactions_in_flight,
    )
    scheme = security.scheme
    print(
        f"coordinator {settings.instance_id}: REST at {scheme}://{rest_host}:{rest_port} "
        f"(advertised {settings.rest_url}), Kafka at {bootstrap}; storage roots "
        f"{defaults.checkpoint_dir} and {defaults.savepoint_dir}",
        flush=True,
    )
    if security.configured:
        print(f"REST security: {security.describe()}", flush=True)
    if web_ui is not None:
        print(f"Flink's web dashboard at {scheme}://{rest_host}:{rest_port}/flink/", flush=True)
    service = CoordinatorService(settings)
    tune_collector()
    asyncio.run(serve(service, rest_host, rest_port, web_ui, security))
