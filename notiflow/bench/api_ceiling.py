"""The minimal acceptance ceiling of ``notiflow bench api`` (``notiflow bench api-ceiling``, a
process of its own): what a durable acceptance cannot do without.

``POST /v1/messages`` parses the JSON body, writes it to Cassandra once (table
:data:`TABLE` of the configured keyspace; the driver and connection settings of
``cassandra.session.connect``), produces it to Kafka once (topic :data:`TOPIC` under the
prefix; the API's producer: acks=all, idempotent, ``api_producer_overrides``), awaits both in
that order and answers ``202``. ``POST /v1/messages:batch`` does the same for each item of
``{"messages": [...]}``: one row per item, the rows in unlogged batches of
``cassandra_batch_rows`` written at once, one produce per item, all awaited, then ``200``
with a ``202`` result per item. No authentication, validation, idempotency reservation,
admission control, templates, outbox or settle write. The server stack is the API's: FastAPI
under uvicorn with uvloop and httptools, ``POST /v1/messages`` served directly as the API
serves it (``gateway/direct.py``), the API's logging configuration (access log included) and
collector settings (``tuning.settle``).
"""

from __future__ import annotations

import asyncio
import json
import logging.config
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from cassandra.query import BatchStatement, BatchType
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from notiflow import tuning
from notiflow.adapters.cassandra.session import aio, connect
from notiflow.adapters.kafka_io import AsyncProducer, OutRecord, kafka_config
from notiflow.gateway.app import logging_config, run_server
from notiflow.gateway.direct import serve_directly
from notiflow.gateway.runtime import api_producer_overrides
from notiflow.settings import Settings

TABLE = "bench_acceptance"
TOPIC = "bench.acceptance"
TTL_S = 86_400
"""Rows of the ceiling table expire after a day: repeated runs must not grow the keyspace."""
JSON = "application/json"

log = logging.getLogger("notiflow.bench.api_ceiling")


def _create_topic(settings: Settings) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = settings.topic(TOPIC)
    admin = AdminClient(kafka_config(settings))
    if topic not in admin.list_topics(timeout=30).topics:
        for fut in admin.create_topics([NewTopic(topic, settings.ingest_partitions, 1)]
                                       ).values():
            fut.result(30)
    return topic


def build_app(settings: Settings) -> FastAPI:
    """The ceiling's ASGI app; Cassandra, Kafka and its topic are set up in the lifespan."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        cluster, session = await asyncio.to_thread(connect, settings)
        await asyncio.to_thread(
            session.execute, f"CREATE TABLE IF NOT EXISTS {TABLE} (idempotency_key text "
            "PRIMARY KEY, message_id text, body text, accepted_at timestamp) "
            f"WITH default_time_to_live = {TTL_S}", timeout=60)
        state["insert"] = await asyncio.to_thread(
            session.prepare, f"INSERT INTO {TABLE} (idempotency_key, message_id, body, "
            "accepted_at) VALUES (?, ?, ?, ?)")
        state["session"] = session
        state["topic"] = await asyncio.to_thread(_create_topic, settings)
        producer = AsyncProducer(settings, **api_producer_overrides())
        state["producer"] = producer
        tuning.settle()
        log.info("acceptance ceiling ready on port %s", settings.api_port)
        try:
            yield
        finally:
            await asyncio.to_thread(producer.close)
            await asyncio.to_thread(cluster.shutdown)

    app = FastAPI(title="notiflow acceptance ceiling", lifespan=lifespan)

    async def accept(request: Request) -> Response:
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return JSONResponse({"error": "malformed_json"}, status_code=400)
        if not isinstance(data, dict):
            return JSONResponse({"error": "invalid_body"}, status_code=422)
        key = request.headers.get("idempotency-key") or uuid.uuid4().hex
        message_id = f"msg_{uuid.uuid4().hex}"
        now = datetime.now(UTC)
        await aio(state["session"].execute_async(state["insert"],
                                                 (key, message_id, raw.decode(), now)))
        await state["producer"].produce(OutRecord(state["topic"], key.encode(), raw))
        return Response(json.dumps({"message_id": message_id, "status": "ACCEPTED",
                                    "accepted_at": now.isoformat()}),
                        status_code=202, media_type=JSON)

    serve_directly(app, "/v1/messages", accept)

    @app.post("/v1/messages:batch")
    async def accept_batch(request: Request) -> Response:
        try:
            data = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return JSONResponse({"error": "malformed_json"}, status_code=400)
        items = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return JSONResponse({"error": "invalid_batch"}, status_code=422)
        now = datetime.now(UTC)
        rows = [(str(i.get("idempotency_key") or uuid.uuid4().hex),
                 f"msg_{uuid.uuid4().hex}", json.dumps(i)) for i in items]
        size = settings.cassandra_batch_rows
        writes = []
        for start in range(0, len(rows), size):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for key, message_id, body in rows[start:start + size]:
                batch.add(state["insert"], (key, message_id, body, now))
            writes.append(aio(state["session"].execute_async(batch)))
        await asyncio.gather(*writes)
        await asyncio.gather(*(state["producer"].produce(
            OutRecord(state["topic"], key.encode(), body.encode()))
            for key, _, body in rows))
        accepted_at = now.isoformat()
        return Response(json.dumps({"results": [
            {"code": 202, "message_id": m, "status": "ACCEPTED", "accepted_at": accepted_at}
            for _, m, _ in rows]}), media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app


def serve(settings: Settings, port: int) -> None:
    """Serve the ceiling on ``api_host:port`` until SIGINT or SIGTERM (uvicorn as
    ``gateway.app.serve`` runs it)."""
    log_config = logging_config(settings)
    settings = settings.model_copy(update={"api_port": port})
    run_server(build_app(settings), settings, log_config)
