"""What tenant A does in ``notiflow chaos hostile-tenant`` (``chaos_hostile.py``): every
attack of the hostile-tenant review at once, through the platform's own front doors, each
answer tallied by action as ``"<status> <reason>"``.

Nothing here connects anywhere but the scenario's loopback processes: private and metadata
addresses appear only inside URLs the API must refuse before it connects to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson

from notiflow.adapters.manifests import tenant_location
from notiflow.bench.harness import Phase
from notiflow.bench.workload import TEMPLATE_IDS, PhoneFactory
from notiflow.inbox.tokens import mint
from notiflow.providers.twilio.signature import SIGNATURE_HEADER
from notiflow.schemas.enums import Channel

TENANT_A = "globex"
TENANT_B = "acme"
CHAT_TEMPLATE = "hostile-chat"
POISON_TEMPLATES: dict[str, str] = {
    "recursive-macro": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(brand) }}",
    "power-7-400000000": "{{ 7**400000000 }}",
    "folded-compare": "{{ (7**400000000) > 1 }}",
    "power-10-5000": "{{ 10**5000 }}",
    "folded-length": "{{ ('a'*2000000000)|length }}",
    "nested-ranges": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ brand }}"
                      "{% endfor %}{% endfor %}"),
    "render-bomb": "{{ brand * 2000000000 }}",
}
"""Template sources tenant A tries to create; those the API takes are then sent."""
PRIVATE_WEBHOOKS = (
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://10.0.0.1/hook", "http://192.168.1.1/hook", "http://172.16.0.1/hook",
    "http://100.64.0.1/hook", "http://[fd12:3456::1]/hook", "http://[fe80::1]/hook",
    "http://224.0.0.1/hook", "http://0.0.0.0/hook", "http://0x0a000001/hook",
    "http://[::ffff:10.0.0.1]/hook",
)
"""Status and campaign webhook URLs the egress rules refuse (the scenario's platform allows
loopback over http, as development does; nothing else here is allowed)."""
BODY_CHUNK = 64 * 1024


@dataclass
class Attack:
    """Tenant A's side of one run: where to send, what is known of B, and the tallies."""

    phase: Phase
    versions: dict[tuple[str, Channel], int]
    window_s: float
    batch: int
    sockets: int
    socket_rate: float
    b_sockets: int
    body_bytes: int
    chat: int
    forged_ingest: int
    b_targets: list[dict[str, Any]]
    """B's messages already sent (message_id, provider_id, provider_message_id)."""
    a_sent: list[dict[str, Any]]
    """A's own ordinary messages already sent (the same fields)."""
    b_manifest: str
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    messages: dict[str, list[str]] = field(default_factory=dict)
    """Action → message ids of A that the API accepted."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    inbox: Counter[str] = field(default_factory=Counter)
    signed_forgeries: int = 0
    phones: PhoneFactory | None = None

    def tally(self, action: str, answer: str, message_id: str | None = None) -> None:
        self.answers[(action, answer)] += 1
        if message_id is not None:
            self.messages.setdefault(action, []).append(message_id)

    def phone(self) -> str:
        assert self.phones is not None
        return self.phones.take()


def answer_of(r: httpx.Response) -> str:
    """``"<status> <reason>"`` of an API answer (its ``reason``, else its ``error``)."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    reason = ""
    if isinstance(doc, dict):
        reason = str(doc.get("reason") or doc.get("error") or "")
    return f"{r.status_code} {reason}".strip()


def sms(attack: Attack, template_id: str, version: int, **extra: Any) -> dict[str, Any]:
    """A send request of A's: one SMS to a fresh number."""
    return {"channel": "SMS", "tier": "P1", "category": "transactional",
            "recipient": attack.phone(), "template_id": template_id,
            "template_version": version,
            "variables": {"brand": "x", "headline": "h", "code": "000000"}, **extra}


async def _post(client: httpx.AsyncClient, action: str, attack: Attack, path: str,
                body: Any, **kw: Any) -> httpx.Response | None:
    try:
        r = await client.post(path, json=body, **kw)
    except httpx.HTTPError as exc:
        attack.tally(action, f"no answer {type(exc).__name__}")
        return None
    mid = None
    if r.status_code == 202:
        mid = r.json().get("message_id")
    attack.tally(action, answer_of(r), mid)
    return r


async def templates_and_batch(attack: Attack, client: httpx.AsyncClient) -> None:
    """Create every poison template; send a few messages with each the API took, and
    ``batch`` messages of the render bomb in one ``POST /v1/messages:batch``."""
    created: dict[str, int] = {}
    for name, body in POISON_TEMPLATES.items():
        r = await _post(client, f"template {name}", attack, "/v1/templates",
                        {"template_id": f"hostile-{name}", "channel": "SMS", "body": body},
                        timeout=120)
        if r is not None and r.status_code in (200, 201):
            created[name] = int(r.json()["version"])
    bomb = created.get("render-bomb")
    if bomb is not None and attack.batch:
        items = [{**sms(attack, "hostile-render-bomb", bomb),
                  "idempotency_key": f"hostile-batch-{uuid.uuid4().hex}"}
                 for _ in range(attack.batch)]
        try:
            r = await client.post("/v1/messages:batch", json={"messages": items}, timeout=300)
        except httpx.HTTPError as exc:
            attack.tally("batch render-bomb", f"no answer {type(exc).__name__}")
        else:
            if r.status_code != 200:
                attack.tally("batch render-bomb", answer_of(r))
            else:
                for item in r.json()["results"]:
                    attack.tally("batch render-bomb item",
                                 f"{item['code']} {item.get('reason', '')}".strip(),
                                 item.get("message_id") if item["code"] == 202 else None)
    for name, version in created.items():
        if name == "render-bomb":
            continue
        for _ in range(5):
            await _post(client, f"send with {name}", attack, "/v1/messages",
                        sms(attack, f"hostile-{name}", version))


async def webhooks_and_policy(attack: Attack, client: httpx.AsyncClient) -> None:
    """Status webhooks at private and metadata addresses (single sends and a batch),
    marketing at P0 and P1, and reads and cancels of B's messages."""
    version = attack.versions[(TENANT_A, Channel.SMS)]
    for url in PRIVATE_WEBHOOKS:
        await _post(client, "status_webhook private", attack, "/v1/messages",
                    sms(attack, TEMPLATE_IDS[Channel.SMS], version, status_webhook=url))
    r = await _post(client, "batch status_webhook private", attack, "/v1/messages:batch",
                    {"messages": [sms(attack, TEMPLATE_IDS[Channel.SMS], version,
                                      status_webhook=url) for url in PRIVATE_WEBHOOKS]})
    for item in r.json().get("results", []) if r is not None and r.status_code == 200 else []:
        attack.tally("batch status_webhook private item",
                     f"{item['code']} {item.get('reason', '')}".strip(),
                     item.get("message_id") if item["code"] == 202 else None)
    for tier in ("P0", "P1"):
        await _post(client, f"marketing at {tier}", attack, "/v1/messages",
                    {**sms(attack, TEMPLATE_IDS[Channel.SMS], version), "tier": tier,
                     "category": "marketing"})
    for target in attack.b_targets:
        mid = target["message_id"]
        try:
            got = await client.get(f"/v1/messages/{mid}")
            attack.tally("read B's message", answer_of(got))
            gone = await client.delete(f"/v1/messages/{mid}")
            attack.tally("cancel B's message", answer_of(gone))
        except httpx.HTTPError as exc:
            attack.tally("read B's message", f"no answer {type(exc).__name__}")


async def campaigns(attack: Attack, client: httpx.AsyncClient) -> None:
    """Campaigns naming B's manifest (and ways around the prefix), and one with a private
    webhook."""
    settings = attack.phase.settings
    own = tenant_location(settings, TENANT_A)
    bucket = urlsplit(own).netloc
    name = attack.b_manifest.rsplit("/", 1)[-1]
    foreign = {
        "B's manifest": attack.b_manifest,
        "B's prefix, no object": f"{tenant_location(settings, TENANT_B)}{uuid.uuid4().hex}.csv",
        "own prefix/../B": f"{own}../{TENANT_B}/bench/{name}",
        "own prefix/%2e%2e/B": f"{own}%2e%2e/{TENANT_B}/bench/{name}",
        "another bucket": f"s3://{bucket}-other/tenants/{TENANT_A}/list.csv",
        "double slash to B": attack.b_manifest.replace("/tenants/", "//tenants/"),
        "file:///etc/passwd": "file:///etc/passwd"}
    version = attack.versions[(TENANT_A, Channel.SMS)]
    body = {"name": "hostile", "channel": "SMS", "tier": "P3", "category": "marketing",
            "template_id": TEMPLATE_IDS[Channel.SMS], "template_version": version,
            "mapping": {"recipient": "phone", "variables": {
                "brand": "first_name", "headline": "first_name", "code": "code"}}}
    bulk = attack.phase.bulk_api
    for label, uri in foreign.items():
        await _post(client, f"campaign manifest: {label}", attack, f"{bulk}/v1/campaigns",
                    {**body, "manifest": uri})
    for url in PRIVATE_WEBHOOKS[:4]:
        await _post(client, "campaign private webhook", attack, f"{bulk}/v1/campaigns",
                    {**body, "manifest": f"{own}list.csv", "webhook": url})


async def chat(attack: Attack, client: httpx.AsyncClient) -> None:
    """``chat`` CHAT messages at P1 to a Teams workflow of A's that answers 503, spread over
    the window, each expiring 30 s after it is sent."""
    version = attack.versions[(TENANT_A, Channel.CHAT)]
    url = f"{attack.phase.fakes}/teams/workflows/hostile-{uuid.uuid4().hex[:8]}/triggers"
    gap = attack.window_s / max(1, attack.chat)
    for i in range(attack.chat):
        expires = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
        await _post(client, "chat to a 503-ing endpoint", attack, "/v1/messages",
                    {"channel": "CHAT", "tier": "P1", "category": "transactional",
                     "recipient": f"{url}/{i % 4}", "template_id": CHAT_TEMPLATE,
                     "template_version": version, "variables": {"text": f"hi {i}"},
                     "expires_at": expires})
        await asyncio.sleep(gap)


async def flood_body(url: str, headers: dict[str, str], offered: int, *,
                     declared: bool = False, timeout: float = 60.0) -> dict[str, Any]:
    """POST up to ``offered`` bytes to ``url`` (chunked, or with a declared
    ``Content-Length``) as fast as the connection takes them, until the server answers or
    closes; what it answered and how many body bytes the kernel had taken by then."""
    return await asyncio.to_thread(_flood, url, headers, offered, declared, timeout)


def _flood(url: str, headers: dict[str, str], offered: int, declared: bool,
           timeout: float) -> dict[str, Any]:
    """:func:`flood_body` on a blocking socket: every turn reads first (an answer stops the
    writing at once, and a reset after it cannot lose it), then writes what the socket
    takes."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    head = [f"POST {parts.path}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {parts.netloc}", "Content-Type: application/json",
            *(f"{k}: {v}" for k, v in headers.items()),
            f"Content-Length: {offered}" if declared else "Transfer-Encoding: chunked"]
    payload = b"a" * BODY_CHUNK
    frame = payload if declared else b"%x\r\n%s\r\n" % (len(payload), payload)
    answer, sent, pending = b"", 0, b""
    t0 = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock, \
            selectors.DefaultSelector() as sel:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        writing = True
        while time.monotonic() - t0 < timeout and b"\r\n\r\n" not in answer:
            if not writing:
                sel.modify(sock, selectors.EVENT_READ)
            masks = [mask for _, mask in sel.select(1.0)]
            readable = any(m & selectors.EVENT_READ for m in masks)
            writable = writing and any(m & selectors.EVENT_WRITE for m in masks)
            try:
                if readable:
                    data = sock.recv(65536)
                    if not data:
                        break
                    answer += data
                    continue
                if writable:
                    if not pending:
                        if sent >= offered:
                            writing = False
                            continue
                        pending = frame
                    n = sock.send(pending)
                    pending = pending[n:]
                    sent += n
            except BlockingIOError:
                continue
            except OSError:
                if readable:
                    break
                writing = False
        if b"\r\n\r\n" in answer:
            sock.settimeout(2)
            with contextlib.suppress(OSError):
                answer += sock.recv(4096)
    status, reason = "no answer", ""
    if answer:
        status = answer.split(b" ", 2)[1].decode(errors="replace")
        body = answer.split(b"\r\n\r\n", 1)[-1]
        with contextlib.suppress(orjson.JSONDecodeError):
            doc = orjson.loads(body) if body.startswith(b"{") else {}
            reason = str(doc.get("reason") or doc.get("error") or "")
    return {"status": status, "reason": reason, "bytes_sent": sent,
            "seconds": round(time.monotonic() - t0, 2)}


async def bodies(attack: Attack) -> None:
    """Bodies far past every limit on the routes a tenant or anyone can reach."""
    phase = attack.phase
    auth = phase.auth(TENANT_A)
    cases = [
        ("POST /v1/messages, chunked", f"{phase.api}/v1/messages", auth, False),
        ("POST /v1/messages:batch, chunked", f"{phase.api}/v1/messages:batch", auth, False),
        ("POST /v1/templates, chunked", f"{phase.api}/v1/templates", auth, False),
        ("POST /v1/messages, declared length", f"{phase.api}/v1/messages", auth, True),
        ("POST /v1/messages, no token, chunked", f"{phase.api}/v1/messages", {}, False),
        ("POST /v1/campaigns, chunked", f"{phase.bulk_api}/v1/campaigns", auth, False),
        ("POST /webhooks/sendgrid, no signature", f"{phase.bulk_api}/webhooks/sendgrid", {},
         False),
        ("POST /webhooks/sendgrid, signature-shaped", f"{phase.bulk_api}/webhooks/sendgrid",
         {"X-Twilio-Email-Event-Webhook-Signature": "MEUCIQ" + "A" * 90,
          "X-Twilio-Email-Event-Webhook-Timestamp": str(int(time.time()))}, False),
        ("POST /webhooks/twilio, signature-shaped", f"{phase.bulk_api}/webhooks/twilio",
         {SIGNATURE_HEADER: "A" * 28}, False),
        ("POST /webhooks/vonage, chunked", f"{phase.bulk_api}/webhooks/vonage", {}, False),
    ]
    for name, url, headers, declared in cases:
        try:
            result = await flood_body(url, headers, attack.body_bytes, declared=declared)
        except OSError as exc:
            result = {"status": f"no connection {type(exc).__name__}", "reason": "",
                      "bytes_sent": 0, "seconds": 0.0}
        attack.bodies.append({"route": name, "offered": attack.body_bytes, **result})
        attack.tally(f"body {name}", f"{result['status']} {result['reason']}".strip())


async def inbox(attack: Attack, ws_base: str) -> None:
    """Open ``sockets`` inbox WebSockets of A's made-up users at ``socket_rate``/s and hold
    them; then ``b_sockets`` of B's users, which must all open."""
    settings = attack.phase.settings
    keys = {t: settings.tenant(t).inbox_keys[0].get_secret_value()  # type: ignore[union-attr]
            for t in (TENANT_A, TENANT_B)}
    held: dict[str, list[aiohttp.ClientWebSocketResponse]] = {"A": [], "B": []}
    readers: list[asyncio.Task[None]] = []
    run = uuid.uuid4().hex[:6]

    async def drain(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for _ in ws:
            pass

    async def one(session: aiohttp.ClientSession, tenant: str, i: int) -> None:
        token = mint(keys[tenant], tenant, f"hostile-{run}-{tenant}-{i}",
                     audience=settings.inbox.token_audience)
        who = "A" if tenant == TENANT_A else "B"
        try:
            ws = await session.ws_connect(f"{ws_base}/v1/inbox/ws",
                                          params={"access_token": token}, heartbeat=None)
        except aiohttp.WSServerHandshakeError as exc:
            attack.inbox[f"{who} {exc.status} {refusal_reason(exc)}".strip()] += 1
            return
        except (aiohttp.ClientError, OSError) as exc:
            attack.inbox[f"{who} no answer {type(exc).__name__}"] += 1
            return
        attack.inbox[f"{who} 101 opened"] += 1
        held[who].append(ws)
        readers.append(asyncio.create_task(drain(ws)))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0, tasks = time.monotonic(), []
        for i in range(attack.sockets):
            tasks.append(asyncio.create_task(one(session, TENANT_A, i)))
            await asyncio.sleep(max(0.0, t0 + (i + 1) / attack.socket_rate - time.monotonic()))
        await asyncio.gather(*tasks)
        await asyncio.gather(*(one(session, TENANT_B, i) for i in range(attack.b_sockets)))
        for who, sockets in held.items():
            attack.inbox[f"{who} still open at the end"] = sum(1 for ws in sockets
                                                              if not ws.closed)
        for task in readers:
            task.cancel()
        for ws in (*held["A"], *held["B"]):
            await ws.close()


def refusal_reason(exc: aiohttp.WSServerHandshakeError) -> str:
    """The inbox gate's reason for a refused upgrade, told by status and ``Retry-After``
    (the handshake error carries no body): ``429`` with 5 s is the tenant's connection cap,
    a shorter wait its connect rate; ``503`` the process's cap."""
    retry = exc.headers.get("Retry-After", "") if exc.headers is not None else ""
    if exc.status == 503:
        return "server_full"
    if exc.status == 429:
        return "tenant_connections" if retry == "5" else "connect_rate"
    return ""
