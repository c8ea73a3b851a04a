"""Watching the secrets directory (``NOTIFLOW_SECRETS_DIR``) of a running process.

Every ``secrets_poll`` the watcher fingerprints the directory's ``NOTIFLOW_*`` files (their
names and contents, following the symlinks a mounted Kubernetes Secret is made of); when the
fingerprint changes it loads the settings afresh and hands them to the process's
:class:`~notiflow.secrets.Keyring`, then to ``on_reload``. Settings that do not load (a
half-written file, an invalid value) are logged and counted, and the credentials in force
stay: a bad rotation never takes a process down."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import SettingsError

from notiflow import names
from notiflow.secrets import Keyring, Reload
from notiflow.settings import Settings
from notiflow.telemetry import meter

log = logging.getLogger("notiflow.secrets")

PREFIX = "notiflow_"

OnReload = Callable[[Reload], Awaitable[None]]


def fingerprint(directory: Path) -> str:
    """SHA-256 over the names and contents of the directory's ``NOTIFLOW_*`` files (names
    case-folded, as the settings read them; a file that vanishes mid-read counts as
    absent)."""
    digest = hashlib.sha256()
    for entry in sorted(directory.iterdir(), key=lambda p: p.name.lower()):
        if not entry.name.lower().startswith(PREFIX):
            continue
        try:
            content = entry.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue
        digest.update(entry.name.lower().encode() + b"\0")
        digest.update(hashlib.sha256(content).digest())
    return digest.hexdigest()


class SecretWatcher:
    """Reloads ``keyring`` from ``load()`` whenever ``directory`` changes."""

    def __init__(self, directory: Path, keyring: Keyring, *, poll_s: float,
                 load: Callable[[], Settings] = Settings,
                 on_reload: OnReload | None = None) -> None:
        self.directory, self.keyring, self.poll_s = directory, keyring, poll_s
        self.load, self.on_reload = load, on_reload
        self._seen = fingerprint(directory)
        self._reloads = names.SECRETS_RELOADS.create(meter())

    async def check(self) -> Reload | None:
        """One look at the directory: the reload it caused, None when nothing changed or the
        new settings did not load."""
        seen = await asyncio.to_thread(fingerprint, self.directory)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            fresh = await asyncio.to_thread(self.load)
        except (ValidationError, SettingsError, ValueError, OSError) as exc:
            self._reloads.add(1, {"outcome": "invalid"})
            log.error("secrets directory changed but does not load (%s); the credentials in "
                      "force stay", type(exc).__name__)
            return None
        change = self.keyring.reload(fresh)
        self._reloads.add(1, {"outcome": "applied" if change.applied else "unchanged"})
        if change.applied:
            log.info("credentials reloaded: %s", ", ".join(change.applied))
        if change.pending:
            log.warning("settings changed that take effect only after a restart: %s",
                        ", ".join(change.pending))
        if change.applied and self.on_reload is not None:
            await self.on_reload(change)
        return change

    async def run(self) -> None:
        """Until cancelled: :meth:`check` every ``poll_s``."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.check()
            except OSError as exc:
                log.error("secrets directory unreadable (%s); the credentials in force stay",
                          exc)


def watcher(keyring: Keyring, on_reload: OnReload | None = None) -> SecretWatcher | None:
    """A watcher of ``keyring.settings.secrets_dir``; None when no directory is set."""
    settings = keyring.settings
    if settings.secrets_dir is None:
        return None
    return SecretWatcher(settings.secrets_dir, keyring,
                         poll_s=settings.secrets_poll.total_seconds(), on_reload=on_reload)
