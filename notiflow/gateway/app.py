"""The Messaging API process (``notiflow api``): FastAPI app and uvicorn server.

One :class:`~notiflow.gateway.runtime.Runtime` per process (one Cassandra store, one Kafka
producer, one Redis client for admission control, the outbox sweeper; the DLQ depth monitor
except in a priority-lane process, which keeps to P0/P1 acceptance), created in the
lifespan and closed on shutdown. ``/healthz`` answers while the process runs; ``/readyz``
also requires Cassandra and Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import logging.config
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from opentelemetry.metrics import CallbackOptions, Observation
from pydantic import BaseModel
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from notiflow import names, redact, telemetry, tuning
from notiflow.adapters.dlq import watch_depth
from notiflow.adapters.providers import provider_specs
from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.gateway import (
    batch,
    campaigns,
    cancel,
    direct,
    errors,
    message_list,
    messages,
    openapi,
    preference_page,
    recipients,
    schedules,
    templates,
    topic_sends,
    topics,
    unsubscribe,
    user_preferences,
    users,
)
from notiflow.gateway.access_log import AccessLog, route_template
from notiflow.gateway.bodies import BodyCeiling
from notiflow.gateway.kafka_window import Window
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.server_limits import uvicorn_options
from notiflow.gateway.sweeper import OutboxSweeper
from notiflow.settings import Settings, load_settings

log = logging.getLogger("notiflow.gateway")

GRACEFUL_SHUTDOWN_S = 10


def receipt_routes(settings: Settings) -> list[ReceiptRoutes]:
    """The delivery-webhook routes of every registered provider plug-in that has them."""
    return [spec.receipt_routes() for spec in provider_specs(type(settings)).values()
            if spec.receipt_routes is not None]


def max_any_body(settings: Settings) -> int:
    """The largest body any route takes (:class:`~notiflow.gateway.bodies.BodyCeiling`)."""
    return max(batch.MAX_BATCH_BYTES, *(r.max_body for r in receipt_routes(settings)))

REPEAT_INTERVAL_S = 60.0
_NOISY_WHEN_DOWN = ("notiflow.kafka.producer", "notiflow.kafka.admin", "cassandra.cluster",
                    "cassandra.connection", "cassandra.pool")


class RepeatFilter(logging.Filter):
    """Passes a record at most once per ``interval_s`` per (logger, level, message template,
    first argument): librdkafka and the Cassandra driver log every reconnect attempt while a
    dependency is down."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, int, str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        first = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
        key = (record.name, record.levelno, str(record.msg), first)
        now = time.monotonic()
        if now - self._last.get(key, -self.interval_s) < self.interval_s:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "filters": {"repeat": {"()": RepeatFilter}},
    "handlers": {
        "stdout": {"class": "logging.StreamHandler", "formatter": "plain",
                   "stream": "ext://sys.stdout"},
    },
    "root": {"handlers": ["stdout"], "level": "WARNING"},
    "loggers": {
        "notiflow": {"level": "INFO"},
        "uvicorn": {"level": "INFO"},
        "uvicorn.error": {"level": "INFO"},
        "uvicorn.access": {"level": "INFO"},
        **{name: {"filters": ["repeat"]} for name in _NOISY_WHEN_DOWN},
    },
}


def observe_window(window: Window, lane: str) -> None:
    """Report ``notiflow.api.kafka_deferred`` (the window's records) for this process."""

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(len(window), {"lane": lane})

    names.API_KAFKA_DEFERRED.create(telemetry.meter(), callbacks=[observe])


class Health(BaseModel):
    status: str


class KafkaWindowView(BaseModel):
    deferred: int
    oldest_age_s: float


class Readiness(BaseModel):
    status: Literal["ready", "degraded"]
    checks: dict[str, str]
    kafka_window: KafkaWindowView | None = None
    """Present when ``degraded``: Kafka is down and the outage window takes P1-P3."""


def build_app(settings: Settings) -> FastAPI:
    """The ASGI app; resources are created when its lifespan starts. ``/openapi.json``,
    ``/docs`` and ``/redoc`` are served only where ``settings.serves_api_docs`` (development
    by default); ``app.openapi()`` builds the document either way."""
    runtime = Runtime(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        redact.configure(settings)
        await runtime.start()
        runtime.spawn(OutboxSweeper(runtime).run(), "outbox-sweeper")
        runtime.spawn(runtime.publisher.drain(), "kafka-window-drain")
        observe_window(runtime.window, settings.api_lane)
        if settings.api_lane != "priority":
            runtime.spawn(watch_depth(settings), "dlq-depth-monitor")
        tuning.settle()
        log.info("messaging API ready on %s:%s (lane %s)", settings.api_host,
                 settings.api_port, settings.api_lane)
        try:
            yield
        finally:
            await runtime.close()
            log.info("messaging API stopped")

    docs = settings.serves_api_docs
    app = FastAPI(title="notiflow Messaging API", version="1", lifespan=lifespan,
                  generate_unique_id_function=openapi.operation_id,
                  openapi_url="/openapi.json" if docs else None,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)
    openapi.install(app)
    app.state.runtime = runtime
    telemetry.instrument_api(app, route_template)
    errors.install(app)
    app.add_middleware(BodyCeiling, limit=max_any_body(settings))
    app.add_middleware(AccessLog)
    app.include_router(batch.router)
    app.include_router(messages.router)
    direct.serve_directly(app, "/v1/messages", messages.send_message_directly)
    app.include_router(cancel.router)
    app.include_router(message_list.router)
    app.include_router(templates.router)
    app.include_router(recipients.router)
    app.include_router(users.router)
    app.include_router(user_preferences.router)
    app.include_router(topics.router)
    app.include_router(topic_sends.router)
    app.include_router(schedules.router)
    app.include_router(campaigns.router)
    if settings.api_lane != "priority":
        app.include_router(unsubscribe.router)
        app.include_router(preference_page.router)
        for routes in receipt_routes(settings):
            app.include_router(routes.router)

    @app.get("/healthz", response_model=Health)
    async def healthz() -> JSONResponse:
        """200 while the process serves requests."""
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", response_model=Readiness, responses=openapi.errors(
        503, r503="`not_ready`, with `checks` naming what is down."))
    async def readyz() -> JSONResponse:
        """200 when Cassandra and Kafka answer, or Cassandra does and the Kafka-outage
        window has room (``degraded``: P1-P3 are accepted, P0 refused); else 503 with the
        failing checks."""
        cassandra, kafka = await asyncio.gather(runtime.check_cassandra(),
                                                runtime.check_kafka())
        checks = {"cassandra": cassandra, "kafka": kafka}
        if all(v == "ok" for v in checks.values()):
            return JSONResponse({"status": "ready", "checks": checks})
        window = runtime.window
        if cassandra == "ok" and not window.full():
            return JSONResponse({"status": "degraded", "checks": checks,
                                 "kafka_window": {"deferred": len(window),
                                                  "oldest_age_s": round(window.oldest_age(),
                                                                        1)}})
        err = errors.unavailable("not_ready", "a dependency is unreachable")
        return JSONResponse({**err.body(), "checks": checks}, status_code=503,
                            headers=err.headers)

    return app


WORKER_APP = "notiflow.gateway.app:worker_app"
"""The import string of :func:`worker_app`: uvicorn's worker processes are spawned (a fresh
interpreter each) and import the app, they cannot inherit one."""


def service(settings: Settings) -> str:
    """The telemetry process name of an API process of ``settings.api_lane``."""
    lane = settings.api_lane
    return "api" if lane == "all" else f"api-{lane}"


def serve(settings: Settings) -> None:
    """Run the API with uvicorn on ``api_host:api_port`` (logs to stdout) until SIGINT or
    SIGTERM; in-flight requests get :data:`GRACEFUL_SHUTDOWN_S` to finish. Logs in
    ``settings.log_format``; telemetry as ``settings.telemetry`` says.

    With ``api_processes`` above 1 this process binds the socket and supervises that many
    worker processes sharing it (uvicorn's ``Multiprocess``: a dead worker is replaced,
    SIGINT or SIGTERM stops every worker gracefully); each worker builds its settings from
    the environment (:func:`worker_env` puts this process's lane, port and process count
    there first) and sets itself up (:func:`worker_app`). The niceness and real-time class
    set here are the workers' too: a child inherits both across ``fork`` and keeps them
    across ``execve`` (Linux ``sched(7)``, ``setpriority(2)``), which is how
    ``multiprocessing``'s spawn starts them, from this process's main thread."""
    log_config = logging_config(settings)
    lane = settings.api_lane
    if settings.api_processes == 1:
        telemetry.setup(settings, service(settings), logs=False)
    tuning.set_nice(settings.lane_nice(lane))
    tuning.set_realtime(settings.lane_realtime(lane))
    if starves_host(settings, os.cpu_count()):
        log.warning("%d API processes in the real-time class on %s cores: busy, they leave "
                    "no CPU to Cassandra and Kafka (docs/api.md, \"Processes\")",
                    settings.api_processes, os.cpu_count())
    if settings.api_processes == 1:
        run_server(build_app(settings), settings, log_config)
        return
    os.environ.update(worker_env(settings))
    run_server(WORKER_APP, settings, log_config, workers=settings.api_processes)


def starves_host(settings: Settings, cores: int | None) -> bool:
    """Whether ``api_processes`` real-time processes (the lane's class) could take every core
    of the host."""
    return (settings.lane_realtime(settings.api_lane) > 0 and cores is not None
            and settings.api_processes >= cores)


def worker_env(settings: Settings) -> dict[str, str]:
    """The ``NOTIFLOW_`` variables a worker needs for ``load_settings()`` to give it the
    settings the command line gave this process (``notiflow api --lane/--port/--processes``
    override the environment and the configuration file)."""
    return {"NOTIFLOW_API_LANE": settings.api_lane,
            "NOTIFLOW_API_PORT": str(settings.api_port),
            "NOTIFLOW_API_PROCESSES": str(settings.api_processes)}


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn's factory, run in the worker): its settings
    from the environment, the logging and telemetry :func:`serve` sets up for one process."""
    settings = load_settings()
    logging_config(settings)
    telemetry.setup(settings, service(settings), logs=False)
    return build_app(settings)


def logging_config(settings: Settings) -> dict[str, Any]:
    """The API's logging configuration in ``settings.log_format``, applied."""
    log_config = telemetry.log_config(LOGGING, settings.log_format)
    logging.config.dictConfig(log_config)
    return log_config


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS options from ``settings.api_tls`` (none while it is off)."""
    tls = settings.api_tls
    if tls.cert_file is None:
        return {}
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED}[tls.client_certs]
    return {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file),
            "ssl_ca_certs": str(tls.client_ca_file) if tls.client_ca_file else None,
            "ssl_cert_reqs": reqs}


def run_server(app: FastAPI | str, settings: Settings, log_config: dict[str, Any], *,
               workers: int = 1) -> None:
    """Serve ``app`` on ``api_host:api_port`` as the API runs (uvloop, httptools with a
    bounded head, ``settings.api_server``'s limits, :data:`GRACEFUL_SHUTDOWN_S`) until
    SIGINT or SIGTERM. ``workers`` above 1: ``app`` is
    the import string of an app factory, served by that many supervised worker processes
    sharing the socket this process binds; exits with uvicorn's startup-failure status
    when a worker could not start (the supervisor then stops)."""
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        loop="uvloop",
        lifespan="on",
        log_config=log_config,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
        workers=workers,
        factory=workers > 1,
        **tls_options(settings),
        **uvicorn_options(settings.api_server),
    )
    if workers == 1:
        uvicorn.Server(config).run()
        return
    if not isinstance(app, str):
        raise TypeError("more than one worker needs the app as an import string")
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        sys.exit(STARTUP_FAILURE)
