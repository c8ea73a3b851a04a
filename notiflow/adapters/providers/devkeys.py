"""Key helpers of the plug-ins' development environments (their ``dev`` modules)."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def private_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    """``key`` as an unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
