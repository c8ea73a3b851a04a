"""APNs' development environment: a provider key and the emulator's TLS files."""

from __future__ import annotations

import secrets
import string
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.base import DevEndpoints
from notiflow.adapters.providers.devkeys import private_pem
from notiflow.extras import needs


def _apple_id() -> str:
    """A random 10-character identifier shaped like Apple's team and key ids."""
    alphabet = string.ascii_uppercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(10))


def apns_tls_files(directory: Path) -> dict[str, str]:
    """A throw-away test CA and a server certificate for ``127.0.0.1``/``localhost`` (made with
    ``trustme``), written to ``directory`` (key file mode 0600); returns the variables that
    point the APNs emulator at its certificate and the adapter at the CA."""
    with needs("emulators", "the APNs emulator's TLS files"):
        import trustme
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="notiflow dev CA")
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (directory / "apns-ca.pem", directory / "apns-emulator.pem",
                                    directory / "apns-emulator.key")
    ca.cert_pem.write_to_path(str(ca_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)
    leaf.private_key_pem.write_to_path(str(key_file))
    return {
        "NOTIFLOW_APNS__CA_FILE": str(ca_file),
        "NOTIFLOW_FAKES_APNS_CERT_FILE": str(cert_file),
        "NOTIFLOW_FAKES_APNS_KEY_FILE": str(key_file),
    }


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random team id and key id and a new EC P-256 signing key (the emulator derives the
    public key from the same variables), the emulator's port, and its TLS files in
    ``endpoints.tls_dir`` (:func:`apns_tls_files`)."""
    return {
        "NOTIFLOW_FAKES_APNS_PORT": str(endpoints.apns_port),
        "NOTIFLOW_APNS__BASE_URL": f"https://127.0.0.1:{endpoints.apns_port}",
        "NOTIFLOW_APNS__TEAM_ID": _apple_id(),
        "NOTIFLOW_APNS__KEY_ID": _apple_id(),
        "NOTIFLOW_APNS__PRIVATE_KEY": private_pem(ec.generate_private_key(ec.SECP256R1())),
        **apns_tls_files(endpoints.tls_dir),
    }
