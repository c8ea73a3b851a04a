"""FCM's development environment."""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives.asymmetric import rsa

from notiflow.adapters.providers.base import DevEndpoints
from notiflow.adapters.providers.devkeys import private_pem


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A service account of a random project with a new 2048-bit RSA key (the emulator checks
    its assertions with the same variables), pointed at the emulator's API and token URI."""
    project = f"notiflow-dev-{secrets.token_hex(3)}"
    account_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {
        "NOTIFLOW_FCM__BASE_URL": f"{endpoints.fakes_url}/fcm",
        "NOTIFLOW_FCM__TOKEN_URI": f"{endpoints.fakes_url}/fcm/token",
        "NOTIFLOW_FCM__PROJECT_ID": project,
        "NOTIFLOW_FCM__CLIENT_EMAIL": f"notiflow-sender@{project}.iam.gserviceaccount.com",
        "NOTIFLOW_FCM__PRIVATE_KEY": private_pem(account_key),
        "NOTIFLOW_FCM__PRIVATE_KEY_ID": secrets.token_hex(20),
    }
