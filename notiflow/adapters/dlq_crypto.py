"""Encryption at rest for DLQ payloads (they hold recipients and content)."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from notiflow.settings import Settings


class DlqKeyMissing(RuntimeError):
    pass


class DlqCipher:
    """Fernet (AES-128-CBC + HMAC-SHA256) with a key from ``NOTIFLOW_DLQ_KEY``.

    Rotation: ``NOTIFLOW_DLQ_KEY=new,old``: the first key encrypts, every listed key
    decrypts."""

    def __init__(self, key: bytes | str) -> None:
        text = key.decode() if isinstance(key, bytes) else key
        self._fernet = MultiFernet([Fernet(k.strip()) for k in text.split(",") if k.strip()])

    @classmethod
    def from_settings(cls, settings: Settings) -> DlqCipher:
        if settings.dlq_key is None:
            raise DlqKeyMissing(
                "NOTIFLOW_DLQ_KEY is not set; generate one with "
                "python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'"
            )
        return cls(settings.dlq_key.get_secret_value())

    def encrypt(self, payload: bytes | None) -> str:
        return self._fernet.encrypt(payload or b"").decode()

    def decrypt(self, token: str) -> bytes:
        try:
            return self._fernet.decrypt(token.encode())
        except InvalidToken as exc:
            raise ValueError("DLQ payload cannot be decrypted with this key") from exc
