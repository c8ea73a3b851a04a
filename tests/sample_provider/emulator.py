"""The sample plug-in's emulator: ``POST /sample/messages`` answers ``201``."""

from __future__ import annotations

from aiohttp import web

from notiflow.fakes.common import CommonKnobs, Emulator
from notiflow.settings import Settings


class SampleEmulator(Emulator[CommonKnobs]):
    def __init__(self, _settings: Settings) -> None:
        super().__init__("sample", CommonKnobs)

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/sample/messages", self.post), *self.admin_routes()]

    async def post(self, _request: web.Request) -> web.Response:
        return web.json_response({"id": "sample-1"}, status=201)
