"""``notiflow inbox``: a user's in-app inbox over HTTP, live over WebSocket or server-sent
events (``docs/inbox.md``).

Every route takes a user token (``inbox/tokens.py``) as ``Authorization: Bearer`` or, where a
browser cannot set headers (WebSocket, ``EventSource``), as ``?access_token=``:

- ``GET /v1/inbox?limit=&cursor=&include_archived=``: the user's items, newest first, and
  ``next_cursor`` while there are older ones.
- ``POST /v1/inbox/{message_id}/state`` ``{"state": "seen" | "read" | "archived"}``: moves the
  item forward (never back; the answer is the item as it then is). The user's other live
  connections get a ``state`` event; a first ``seen`` reports the message DELIVERED and a
  first ``read`` OPENED (receipts to ``notify.receipts``). A move is stored only after its
  receipts were acknowledged by Kafka, and answered only after both: when either fails
  nothing moves, the answer is ``503`` (a WebSocket ``error`` frame), and the client's retry
  sends the receipts again (the reconciler deduplicates them by ``provider_event_id``).
- ``GET /v1/inbox/ws``: a WebSocket; the server sends ``item`` and ``state`` events, the
  client may send ``{"type": "mark", "id", "state"}``. ``?since=<cursor>`` first replays the
  items after it.
- ``GET /v1/inbox/events``: the same events as ``text/event-stream`` (each ``id`` a cursor,
  so ``Last-Event-ID`` replays what a reconnecting client missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from aiohttp import WSMsgType, web
from opentelemetry.metrics import CallbackOptions, Observation

from notiflow import names, telemetry
from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.inbox_store import (
    Cursor,
    InboxFeed,
    InboxItem,
    InboxStore,
    channel_key,
    channel_pattern,
)
from notiflow.adapters.kafka_io import AsyncProducer, DeliveryFailed, OutRecord, make_headers
from notiflow.adapters.outages import REDIS_DOWN, STORE_FAILURE
from notiflow.inbox.hub import Connection, Hub, listen
from notiflow.inbox.limits import Gate
from notiflow.inbox.states import COLUMNS, InboxState
from notiflow.inbox.tokens import TokenRefused, User, verify
from notiflow.ops.procs import serve_until_signalled
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt
from notiflow.settings import Settings

log = logging.getLogger(__name__)

RECEIPT_OF: Final = {InboxState.SEEN: Status.DELIVERED, InboxState.READ: Status.OPENED}
"""The receipt a first move into a state reports."""
REPLAY_LIMIT: Final = 200
RECEIPT_TIMEOUT_MS: Final = 5_000
"""How long a mark waits for Kafka to acknowledge its receipts before it is refused."""
RETRY_AFTER_S: Final = 1
REFUSALS: Final[dict[int, type[web.HTTPException]]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound,
    422: web.HTTPUnprocessableEntity, 429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable}


def _json(status: int, doc: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


def refusal(status: int, error: str, reason: str,
            headers: dict[str, str] | None = None) -> web.HTTPException:
    return REFUSALS[status](body=orjson.dumps({"error": error, "reason": reason}),
                            content_type="application/json", headers=headers)


@dataclass(frozen=True, slots=True)
class NotRecorded:
    """A mark that did not happen: its receipts (``receipts_unavailable``) or the store
    (``store_unavailable``) failed. The item did not move, or moved only as far as a retry of
    the same mark takes it again; the client retries."""

    reason: str


class InboxServer:
    """The routes and what they share: the store, the feed, the hub, the receipts producer."""

    def __init__(self, settings: Settings, store: InboxStore, feed: InboxFeed,
                 producer: AsyncProducer | None) -> None:
        self.settings = settings
        self.store = store
        self.feed = feed
        self.producer = producer
        self.hub = Hub(settings.inbox.max_connections_per_user)
        self.gate = Gate(settings.inbox)
        meter = telemetry.meter()
        self._refusals = names.INBOX_REFUSALS.create(meter)
        names.INBOX_CONNECTIONS.create(meter, callbacks=[self._observe])
        self._frames = names.INBOX_FRAMES.create(meter)
        self._overflows = names.INBOX_OVERFLOWS.create(meter)
        self._counted = (0, 0)

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """The connections gauge, and the hub's frames and overflows since the last
        collection added to their counters (the hub itself knows nothing of telemetry)."""
        hub = self.hub
        frames, overflows = self._counted
        self._frames.add(hub.delivered - frames, {"process": "inbox"})
        self._overflows.add(hub.overflowed - overflows, {"process": "inbox"})
        self._counted = (hub.delivered, hub.overflowed)
        for transport, n in hub.by_transport().items():
            yield Observation(n, {"transport": transport})

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/healthz", self.health), web.get("/v1/inbox", self.list_items),
                web.post("/v1/inbox/{message_id}/state", self.set_state),
                web.get("/v1/inbox/ws", self.websocket),
                web.get("/v1/inbox/events", self.events)]

    def user(self, request: web.Request) -> User:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") \
            else request.query.get("access_token", "")
        if not token:
            raise refusal(401, "unauthorized", "missing_token")
        try:
            return verify(token, self.settings)
        except TokenRefused as exc:
            raise refusal(401, "unauthorized", exc.reason) from None

    async def health(self, _request: web.Request) -> web.Response:
        return _json(200, {"status": "ok", "connections": self.hub.connections})

    async def list_items(self, request: web.Request) -> web.Response:
        user = self.user(request)
        inbox = self.settings.inbox
        try:
            limit = int(request.query.get("limit", inbox.page_size))
            before = Cursor.parse(request.query["cursor"]) if "cursor" in request.query \
                else None
        except ValueError:
            raise refusal(400, "bad_request", "invalid_paging") from None
        if not 1 <= limit <= inbox.max_page:
            raise refusal(400, "bad_request", "invalid_paging")
        archived = request.query.get("include_archived", "false").lower() == "true"
        items: list[InboxItem] = []
        more = True
        for _ in range(5):
            page = await self.store.page(user.tenant_id, user.user_id, before, limit + 1)
            more = len(page) > limit
            page = page[:limit] if more else page
            if page:
                before = page[-1].cursor
            items.extend(i for i in page if archived or i.state is not InboxState.ARCHIVED)
            if len(items) >= limit or not more:
                break
        items = items[:limit]
        next_cursor = items[-1].cursor.text() if items and more else None
        return _json(200, {"items": [i.view() for i in items], "next_cursor": next_cursor})

    async def set_state(self, request: web.Request) -> web.Response:
        user = self.user(request)
        try:
            doc = orjson.loads(await request.read())
            state = InboxState(doc["state"]) if isinstance(doc, dict) else None
        except (orjson.JSONDecodeError, KeyError, ValueError):
            state = None
        if state is None or state is InboxState.NEW:
            raise refusal(422, "validation_failed", "invalid_state")
        item = await self.mark(user, request.match_info["message_id"], state)
        if item is None:
            raise refusal(404, "not_found", "unknown_item")
        if isinstance(item, NotRecorded):
            raise refusal(503, "unavailable", item.reason,
                          {"Retry-After": str(RETRY_AFTER_S)})
        return _json(200, item.view())

    async def mark(self, user: User, message_id: str,
                   state: InboxState) -> InboxItem | NotRecorded | None:
        """Move an item forward: its receipts first (acknowledged by Kafka), then the store,
        then the user's other connections are told. None when the user has no such item;
        :class:`NotRecorded` when the receipts or the store failed (nothing is lost: the
        client's retry repeats both)."""
        now = datetime.now(UTC)
        try:
            moved = await self.store.plan(user.tenant_id, user.user_id, message_id, state, now)
        except STORE_FAILURE:
            return NotRecorded("store_unavailable")
        if moved is None:
            return None
        before, after = moved
        if after.state is before.state:
            return after
        try:
            await self.receipts(before, after)
        except DeliveryFailed:
            log.warning("inbox: receipts of %s not acknowledged; the mark is refused",
                        message_id)
            return NotRecorded("receipts_unavailable")
        try:
            await self.store.apply(before, after, now)
        except STORE_FAILURE:
            return NotRecorded("store_unavailable")
        with contextlib.suppress(*REDIS_DOWN):
            await self.feed.publish(user.tenant_id, user.user_id, {
                "type": "state", "id": message_id, "state": after.state.value})
        return after

    async def receipts(self, before: InboxItem, after: InboxItem) -> None:
        """Produce the receipts of the states ``after`` reaches first (``DeliveryFailed``
        when Kafka does not acknowledge one)."""
        if self.producer is None:
            return
        for state, status in RECEIPT_OF.items():
            column = COLUMNS[state]
            at = after.times()[column]
            if before.times()[column] is not None or at is None:
                continue
            receipt = Receipt(provider_id=self.settings.inbox.provider_id,
                              provider_event_id=f"{after.message_id}:{state.value}",
                              provider_message_id=after.message_id, status=status,
                              occurred_at=at, raw_status=state.value,
                              message_id=after.message_id, attempt=after.attempt)
            await self.producer.produce(OutRecord(
                self.settings.receipts_topic, after.message_id.encode(),
                receipt.model_dump_json(exclude_none=True).encode(),
                make_headers(after.message_id, after.tenant_id, after.tier)))

    def admitted(self, user: User) -> contextlib.AbstractContextManager[None]:
        """A place for one more live connection of the user's tenant, held while the
        returned context is; ``503``/``429`` with ``Retry-After`` (before any upgrade) when
        the process or the tenant has no room (``inbox/limits.py``)."""
        refused = self.gate.admit(user.tenant_id)
        if refused is not None:
            self._refusals.add(1, {"reason": refused.reason})
            raise refusal(refused.status,
                          "unavailable" if refused.status == 503 else "rate_limited",
                          refused.reason, {"Retry-After": str(refused.retry_after_s)})
        return self.gate.held(user.tenant_id)

    @staticmethod
    def since(value: str | None) -> Cursor | None:
        """The cursor a client resumes from; 400 ``invalid_cursor`` (before any upgrade)."""
        if not value:
            return None
        try:
            return Cursor.parse(value)
        except ValueError:
            raise refusal(400, "bad_request", "invalid_cursor") from None

    async def replay(self, user: User, after: Cursor | None, conn: Connection) -> None:
        """Queue the items after ``after``, then a ``gap`` event when there were more than
        :data:`REPLAY_LIMIT` (the client pages for the rest)."""
        if after is None:
            return
        items, gap = await self.store.since(user.tenant_id, user.user_id, after, REPLAY_LIMIT)
        for item in items:
            conn.offer(orjson.dumps({"type": "item", "item": item.view()}))
        if gap:
            conn.offer(orjson.dumps({"type": "gap"}))

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        user = self.user(request)
        after = self.since(request.query.get("since"))
        with self.admitted(user):
            return await self._websocket(request, user, after)

    async def _websocket(self, request: web.Request, user: User,
                         after: Cursor | None) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=self.settings.inbox.heartbeat.total_seconds(),
                                   max_msg_size=64 * 1024)
        await ws.prepare(request)
        conn = Connection(channel_key(self.settings.topic_prefix, user.tenant_id, user.user_id),
                          self.settings.inbox.send_queue,
                          lambda frame: ws.send_str(frame.decode()))
        self.hub.join(conn)
        pump = asyncio.create_task(conn.pump())
        closer = asyncio.create_task(_close_when_done(conn, ws))
        try:
            await self.replay(user, after, conn)
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    await self.on_client_frame(user, conn, msg.data)
        finally:
            self.hub.leave(conn)
            conn.close()
            for task in (pump, closer):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await task
            await ws.close()
        return ws

    async def on_client_frame(self, user: User, conn: Connection, text: str) -> None:
        try:
            doc = orjson.loads(text)
            if not isinstance(doc, dict) or doc.get("type") != "mark":
                raise ValueError("unknown frame")
            state = InboxState(doc["state"])
            item = await self.mark(user, str(doc["id"]), state)
        except (orjson.JSONDecodeError, KeyError, ValueError):
            conn.offer(orjson.dumps({"type": "error", "reason": "invalid_frame"}))
            return
        if item is None or isinstance(item, NotRecorded):
            reason = "unknown_item" if item is None else item.reason
            conn.offer(orjson.dumps({"type": "error", "reason": reason,
                                     "id": str(doc["id"])}))
        else:
            conn.offer(orjson.dumps({"type": "state", "id": item.message_id,
                                     "state": item.state.value}))

    async def events(self, request: web.Request) -> web.StreamResponse:
        user = self.user(request)
        after = self.since(request.headers.get("Last-Event-ID") or request.query.get("since"))
        with self.admitted(user):
            return await self._events(request, user, after)

    async def _events(self, request: web.Request, user: User,
                      after: Cursor | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"})
        await response.prepare(request)

        async def write(frame: bytes) -> None:
            await response.write(sse(frame))

        conn = Connection(channel_key(self.settings.topic_prefix, user.tenant_id, user.user_id),
                          self.settings.inbox.send_queue, write, "sse")
        self.hub.join(conn)
        beat = self.settings.inbox.heartbeat.total_seconds()
        pump = asyncio.create_task(conn.pump())
        try:
            await response.write(b": connected\n\n")
            await self.replay(user, after, conn)
            while not pump.done():
                await asyncio.wait([pump], timeout=beat)
                if not pump.done():
                    await response.write(b": ping\n\n")
        except ConnectionError:
            pass
        finally:
            self.hub.leave(conn)
            conn.close()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await pump
        return response


async def _close_when_done(conn: Connection, ws: web.WebSocketResponse) -> None:
    """Close the socket once the hub closed its connection (a newer device over the limit,
    or a client too far behind): the client reconnects and catches up."""
    await conn.closed.wait()
    await ws.close(code=4000 if conn.overflowed else 4001,
                   message=b"behind" if conn.overflowed else b"replaced")


def sse(frame: bytes) -> bytes:
    """One event of ``text/event-stream``: the event's type, its cursor as ``id`` (items),
    and the JSON as ``data``."""
    doc = orjson.loads(frame)
    head = f"event: {doc.get('type', 'message')}\n"
    if doc.get("type") == "item":
        head = f"id: {doc['item']['cursor']}\n" + head
    return head.encode() + b"data: " + frame + b"\n\n"


async def build(settings: Settings) -> web.Application:
    """The application with its store, feed, receipts producer and subscription (opened
    here, closed with the app)."""
    cluster, session = await asyncio.to_thread(connect, settings)
    feed = InboxFeed.open(settings)
    producer = AsyncProducer(settings, **{"delivery.timeout.ms": RECEIPT_TIMEOUT_MS,
                                          "request.timeout.ms": RECEIPT_TIMEOUT_MS})
    server = InboxServer(settings, InboxStore(session, settings), feed, producer)
    app = web.Application(client_max_size=64 * 1024)
    app.add_routes(server.routes())

    async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
        pubsub = feed.r.pubsub(ignore_subscribe_messages=True)
        task = asyncio.create_task(listen(pubsub, channel_pattern(settings.topic_prefix),
                                          server.hub))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pubsub.aclose()
        await feed.aclose()
        if server.producer is not None:
            server.producer.close()
        await asyncio.to_thread(cluster.shutdown)

    app.cleanup_ctx.append(lifecycle)
    return app


async def run(settings: Settings, stop: asyncio.Event) -> None:
    app = await build(settings)
    limits = settings.inbox.server
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0,
                           keepalive_timeout=limits.keep_alive.total_seconds())
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.inbox.host, settings.inbox.port,
                           backlog=limits.backlog, reuse_address=True)
        await site.start()
        log.info("inbox listening on http://%s:%d", settings.inbox.host, settings.inbox.port)
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT."""
    telemetry.setup(settings, "inbox")
    serve_until_signalled(lambda stop: run(settings, stop))
