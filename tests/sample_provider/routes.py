"""The sample plug-in's receipt route: ``POST /webhooks/sample``."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Response

from notiflow.adapters.providers.base import ReceiptRoutes

router = APIRouter()


@router.post("/webhooks/sample")
async def sample_receipt() -> Response:
    """Takes a sample receipt."""
    return Response(status_code=200)


ROUTES: Final = ReceiptRoutes(router, 16 * 1024 * 1024)
