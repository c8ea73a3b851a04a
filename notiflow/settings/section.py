"""The base of every settings section: a frozen model that refuses unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, SecretStr


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def present(secret: SecretStr | None) -> bool:
    """A secret is configured and not empty."""
    return secret is not None and bool(secret.get_secret_value())
