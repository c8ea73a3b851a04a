"""``notiflow fakes``: the emulators of the registered provider plug-ins (each plug-in's
``emulator`` module) on one loopback HTTP server.

Routes: each emulator under its provider prefix (``/twilio/...``, ``/sendgrid/...``,
``/fcm/...``, ``/vonage/...``, ``/slack/...``, ``/teams/...``), its admin API under
``/_admin/{provider}/...``, plus ``GET /_admin/health`` and ``POST /_admin/reset`` (every
emulator: records, pending callbacks, issued tokens and knobs). The SMTP emulator listens on
``fakes_smtp_port`` while this app runs, and keeps its admin API here. APNs is HTTP/2-only:
its emulator listens on its own TLS port (``fakes_apns_port``) while this app runs, and keeps
its admin API here. See ``docs/providers.md``.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from notiflow.adapters.providers import provider_specs
from notiflow.adapters.providers.base import Emulator, EmulatorFactory
from notiflow.ops.procs import serve_until_signalled
from notiflow.settings import Settings

log = logging.getLogger(__name__)

EMULATORS = web.AppKey("emulators", dict[str, Emulator])
"""Plug-in name → its emulator, in registry order."""


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _reset(request: web.Request) -> web.Response:
    for emulator in request.app[EMULATORS].values():
        emulator.reset()
    return web.json_response({"reset": True})


def factories(settings: Settings) -> dict[str, EmulatorFactory]:
    """Plug-in name → its emulator's factory, for every registered plug-in that has one;
    imports the emulators (the ``emulators`` extra)."""
    return {name: spec.emulator() for name, spec in provider_specs(type(settings)).items()
            if spec.emulator is not None}


def emulators(settings: Settings) -> dict[str, Emulator]:
    """Plug-in name → a new emulator, for every registered plug-in that has one."""
    return {name: factory(settings) for name, factory in factories(settings).items()}


def build_app(settings: Settings) -> web.Application:
    """The emulators' application; each emulator's ``lifecycle`` (callback dispatchers,
    the SMTP and APNs listeners) runs while it is started."""
    app = web.Application(client_max_size=1024 * 1024)
    app[EMULATORS] = emulators(settings)
    for emulator in app[EMULATORS].values():
        app.add_routes(emulator.routes())
        app.cleanup_ctx.append(emulator.lifecycle)
    app.router.add_get("/_admin/health", _health)
    app.router.add_post("/_admin/reset", _reset)
    return app


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Serve on ``fakes_host:fakes_port`` until ``stop`` is set, then shut down cleanly
    (requests still hanging on purpose are dropped after one second)."""
    runner = web.AppRunner(build_app(settings), access_log=None, handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.fakes_host, settings.fakes_port, backlog=2048,
                           reuse_address=True)
        await site.start()
        log.info("fakes listening on http://%s:%d", settings.fakes_host, settings.fakes_port)
        await stop.wait()
        log.info("fakes stopping")
    finally:
        await runner.cleanup()


def serve(settings: Settings) -> None:
    """Run the emulators until SIGTERM or SIGINT; return after a clean shutdown."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_until_signalled(lambda stop: run(settings, stop))
