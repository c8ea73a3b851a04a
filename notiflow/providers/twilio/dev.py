"""Twilio's development environment."""

from __future__ import annotations

import secrets

from notiflow.adapters.providers.base import DevEndpoints


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random account SID and auth token (the emulator checks requests and signs status
    callbacks with them); status callbacks go to the API's ``/webhooks/twilio``, texts to
    the account's numbers to its ``/webhooks/twilio/inbound``."""
    return {
        "NOTIFLOW_TWILIO__BASE_URL": f"{endpoints.fakes_url}/twilio",
        "NOTIFLOW_TWILIO__ACCOUNT_SID": "AC" + secrets.token_hex(16),
        "NOTIFLOW_TWILIO__AUTH_TOKEN": secrets.token_hex(16),
        "NOTIFLOW_TWILIO__STATUS_CALLBACK_URL": f"{endpoints.webhook_url}/webhooks/twilio",
        "NOTIFLOW_TWILIO__INBOUND_URL": f"{endpoints.webhook_url}/webhooks/twilio/inbound",
    }
