"""HTTP/2 client candidates for APNs, measured against the APNs emulator on loopback.

The emulator (``notiflow.providers.apns.emulator``, an ``h2`` server on uvloop) runs in a child
process with a throw-away ``trustme`` CA and certificate (TLS, ALPN ``h2``, provider-token
checks on). Each
candidate sends N notifications at a bounded concurrency over one client, and the script prints
requests/s, the client process's CPU time per request (all its threads), how many answers were
200, and errors by exception type. Client and emulator share the machine's cores.

    .venv/bin/python notiflow/bench/http2_clients.py        # N=3000 at concurrency 50 and 100
    .venv/bin/python notiflow/bench/http2_clients.py -n 5000 -c 100 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import ssl
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import uvloop
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import SecretStr
from pyreqwest.client import ClientBuilder

from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.devenv import free_port
from notiflow.providers.apns.client import ApnsPush
from notiflow.providers.apns.config import ApnsSettings
from notiflow.providers.apns.dev import apns_tls_files
from notiflow.providers.apns.tokens import ProviderTokens
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings

Send = Callable[[int], Awaitable[int]]
"""i → HTTP status of the i-th request."""


@dataclass
class Result:
    name: str
    concurrency: int
    n: int
    seconds: float
    cpu_seconds: float = 0.0
    """CPU time of this (client) process, every thread included."""
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        ok = self.statuses.get(200, 0)
        errors = ", ".join(f"{k} {v}" for k, v in self.errors.most_common()) or "0"
        return (f"{self.name:<34} c={self.concurrency:<4} n={self.n:<6} "
                f"{self.n / self.seconds:>8,.0f} req/s   client CPU "
                f"{self.cpu_seconds / self.n * 1e6:>4,.0f} µs/req   200: {ok:<6} "
                f"errors: {errors}")


def bench_spec(directory: Path) -> dict[str, str]:
    """What both processes need: a fresh APNs key, TLS files, a free port."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"port": str(free_port()), "pem": pem, **apns_tls_files(directory)}


def bench_settings(spec: dict[str, str]) -> Settings:
    port = int(spec["port"])
    return Settings(
        apns=ApnsSettings(base_url=f"https://127.0.0.1:{port}", team_id="BENCHTEAM1",
                          key_id="BENCHKEY01", private_key=SecretStr(spec["pem"]),
                          ca_file=spec["NOTIFLOW_APNS__CA_FILE"]),
        fakes_apns_port=port,
        fakes_apns_cert_file=Path(spec["NOTIFLOW_FAKES_APNS_CERT_FILE"]),
        fakes_apns_key_file=Path(spec["NOTIFLOW_FAKES_APNS_KEY_FILE"]),
    )


def serve(spec: dict[str, str]) -> None:
    """Child process: the APNs emulator alone, until killed."""
    from notiflow.providers.apns.emulator import ApnsEmulator

    async def main() -> None:
        emulator = ApnsEmulator(bench_settings(spec))
        emulator.knobs = emulator.knobs.model_copy(update={"max_records": 1000})
        await emulator.start()
        await asyncio.Event().wait()

    uvloop.run(main())


def wait_listening(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"emulator did not listen on {port}")


def token_hex() -> str:
    return "0123" + uuid.uuid4().hex + uuid.uuid4().hex[:28]


def request_headers(settings: Settings, tokens: ProviderTokens) -> dict[str, str]:
    return {"authorization": f"bearer {tokens.current()}", "apns-topic": settings.apns.topic,
            "apns-push-type": "alert", "apns-priority": "10", "apns-expiration": "0",
            "content-type": "application/json"}


BODY = b'{"aps":{"alert":{"title":"Your code","body":"Your code is 123456"}},"attempt":1}'


async def run(name: str, send: Send, n: int, concurrency: int) -> Result:
    result = Result(name, concurrency, n, 0.0)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            try:
                result.statuses[await send(i)] += 1
            except Exception as exc:
                result.errors[type(exc).__name__] += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu
    return result


async def pyreqwest_http2(settings: Settings, n: int, concurrency: int) -> Result:
    tokens = ProviderTokens.from_settings(settings.apns)
    headers = request_headers(settings, tokens)
    assert settings.apns.ca_file is not None
    client = (ClientBuilder().http2_prior_knowledge()
              .add_root_certificate_pem(Path(settings.apns.ca_file).read_bytes())
              .connect_timeout(timedelta(seconds=5)).build())
    base = settings.apns.base_url

    async def send(i: int) -> int:
        request = (client.post(f"{base}/3/device/{token_hex()}").headers(headers)
                   .body_bytes(BODY).build())
        async with asyncio.timeout(10):
            response = await request.send()
            await response.bytes()
        return response.status

    try:
        await send(0)
        return await run("pyreqwest 0.15.1 HTTP/2", send, n, concurrency)
    finally:
        await client.close()


async def httpx_http2(settings: Settings, n: int, concurrency: int) -> Result:
    tokens = ProviderTokens.from_settings(settings.apns)
    headers = request_headers(settings, tokens)
    context = ssl.create_default_context(cafile=settings.apns.ca_file)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    base = settings.apns.base_url
    async with httpx.AsyncClient(http2=True, http1=False, verify=context, limits=limits,
                                 timeout=10) as client:

        async def send(i: int) -> int:
            response = await client.post(f"{base}/3/device/{token_hex()}", headers=headers,
                                         content=BODY)
            if response.http_version != "HTTP/2":
                raise RuntimeError(f"negotiated {response.http_version}")
            return response.status_code

        await send(0)
        return await run("httpx 0.28.1 + h2 4.4.1 HTTP/2", send, n, concurrency)


async def adapter(settings: Settings, n: int, concurrency: int) -> Result:
    client = await ApnsPush.open(settings, timeout=10.0)

    async def send(i: int) -> int:
        message = OutboundMessage(uuid.uuid4().hex, 1, "bench", Channel.PUSH, Tier.P1,
                                  PushRecipient(device_token=token_hex(),
                                                platform=PushPlatform.IOS),
                                  "Your code is 123456", "Your code")
        result = await client.send(message)
        if result.outcome is not Outcome.ACCEPTED:
            raise RuntimeError(f"{result.outcome}:{result.reason}")
        return 200

    try:
        await send(0)
        return await run("ApnsPush adapter (pyreqwest)", send, n, concurrency)
    finally:
        await client.aclose()


CANDIDATES = {"pyreqwest": pyreqwest_http2, "httpx": httpx_http2, "adapter": adapter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="requests per run")
    parser.add_argument("-c", "--concurrency", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="notiflow-bench-") as tmp:
        spec = bench_spec(Path(tmp))
        settings = bench_settings(spec)
        child = multiprocessing.get_context("spawn").Process(target=serve, args=(spec,),
                                                             daemon=True)
        child.start()
        try:
            wait_listening(settings.fakes_apns_port)
            names = args.only or list(CANDIDATES)
            for _ in range(args.rounds):
                for concurrency in args.concurrency:
                    for name in names:
                        result = uvloop.run(CANDIDATES[name](settings, args.n, concurrency))
                        print(result.line(), flush=True)
        finally:
            child.terminate()
            child.join(5)


if __name__ == "__main__":
    main()
