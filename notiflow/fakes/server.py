"""``notiflow fakes``: the provider emulators on one loopback HTTP server.

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

from notiflow.fakes.apns import ApnsEmulator
from notiflow.fakes.chat import SlackEmulator, TeamsEmulator
from notiflow.fakes.fcm import FcmEmulator
from notiflow.fakes.sendgrid import SendGridEmulator
from notiflow.fakes.ses import SesEmulator
from notiflow.fakes.smtp import SmtpEmulator
from notiflow.fakes.twilio import TwilioEmulator
from notiflow.fakes.vonage import VonageEmulator
from notiflow.ops.procs import serve_until_signalled
from notiflow.settings import Settings

log = logging.getLogger(__name__)

TWILIO = web.AppKey("twilio", TwilioEmulator)
SENDGRID = web.AppKey("sendgrid", SendGridEmulator)
SES = web.AppKey("ses", SesEmulator)
FCM = web.AppKey("fcm", FcmEmulator)
VONAGE = web.AppKey("vonage", VonageEmulator)
SMTP = web.AppKey("smtp", SmtpEmulator)
APNS = web.AppKey("apns", ApnsEmulator)
SLACK = web.AppKey("slack", SlackEmulator)
TEAMS = web.AppKey("teams", TeamsEmulator)


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _reset(request: web.Request) -> web.Response:
    request.app[TWILIO].reset()
    request.app[SENDGRID].reset()
    request.app[SES].reset()
    request.app[FCM].reset()
    request.app[VONAGE].reset()
    request.app[SMTP].reset()
    request.app[APNS].reset()
    request.app[SLACK].reset()
    request.app[TEAMS].reset()
    return web.json_response({"reset": True})


def build_app(settings: Settings) -> web.Application:
    """The emulators' application; the callback dispatchers and the SMTP listener run while
    it is started."""
    app = web.Application(client_max_size=1024 * 1024)
    twilio = TwilioEmulator(settings)
    app[TWILIO] = twilio
    app.add_routes(twilio.routes())
    sendgrid = SendGridEmulator(settings)
    app[SENDGRID] = sendgrid
    app.add_routes(sendgrid.routes())
    ses = SesEmulator(settings)
    app[SES] = ses
    app.add_routes(ses.routes())
    fcm = FcmEmulator(settings)
    app[FCM] = fcm
    app.add_routes(fcm.routes())
    vonage = VonageEmulator(settings)
    app[VONAGE] = vonage
    app.add_routes(vonage.routes())
    smtp = SmtpEmulator(settings)
    app[SMTP] = smtp
    app.add_routes(smtp.routes())
    apns = ApnsEmulator(settings)
    app[APNS] = apns
    app.add_routes(apns.routes())
    slack = SlackEmulator()
    app[SLACK] = slack
    app.add_routes(slack.routes())
    teams = TeamsEmulator()
    app[TEAMS] = teams
    app.add_routes(teams.routes())
    app.router.add_get("/_admin/health", _health)
    app.router.add_post("/_admin/reset", _reset)
    app.cleanup_ctx.append(twilio.lifecycle)
    app.cleanup_ctx.append(sendgrid.lifecycle)
    app.cleanup_ctx.append(ses.lifecycle)
    app.cleanup_ctx.append(vonage.lifecycle)
    app.cleanup_ctx.append(smtp.lifecycle)
    app.cleanup_ctx.append(apns.lifecycle)
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
