"""SES's development environment: the emulator's key pair and its SNS topic; SES itself stays
off (``ses.access_key_id`` unset), so the email routes are those of SendGrid and SMTP."""

from __future__ import annotations

import secrets
import string
from typing import Final

from notiflow.adapters.providers.base import DevEndpoints

SES_TOPIC: Final = "arn:aws:sns:us-east-1:000000000000:notiflow-ses-events"
"""The SNS topic of SES events in the development environment (the SES emulator's)."""


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """The key pair the SES emulator accepts, and its SNS topic delivering to the API's
    ``/webhooks/ses``, which takes certificates from the emulator's loopback host over HTTP
    and SHA-1 signatures too (the emulator signs with either; the third-party validator the
    tests check its posts with knows SHA-1 only)."""
    return {
        "NOTIFLOW_SES__ENDPOINT_URL": f"{endpoints.fakes_url}/ses",
        "NOTIFLOW_FAKES_SES_ACCESS_KEY_ID": "AKIA" + "".join(
            secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
        "NOTIFLOW_FAKES_SES_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "NOTIFLOW_SES__SNS_TOPIC_ARNS": f'["{SES_TOPIC}"]',
        "NOTIFLOW_SES__SNS_HOST_PATTERN": r"127\.0\.0\.1",
        "NOTIFLOW_SES__SNS_REQUIRE_HTTPS": "false",
        "NOTIFLOW_SES__SNS_SIGNATURE_V1": "true",
        "NOTIFLOW_FAKES_SES_SNS_ENDPOINT_URL": f"{endpoints.webhook_url}/webhooks/ses",
    }
