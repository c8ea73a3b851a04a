"""The secrets directory: read as the environment is (nested names, winning over the
environment, a Kubernetes Secret's symlinks), and watched: a change reloads the keyring, a
change that does not load keeps the credentials in force."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from notiflow.adapters.secret_watch import fingerprint, watcher
from notiflow.secrets import Keyring, Reload
from notiflow.settings import Settings


def write(directory: Path, name: str, value: str) -> None:
    """Replace a file as a Secret volume does: write aside, then rename over."""
    aside = directory / f".{name}.tmp"
    aside.write_text(value)
    os.replace(aside, directory / name)


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir()
    monkeypatch.setenv("NOTIFLOW_SECRETS_DIR", str(directory))
    monkeypatch.setenv("NOTIFLOW_TWILIO__ACCOUNT_SID", "AC" + "1" * 32)
    monkeypatch.setenv("NOTIFLOW_TWILIO__AUTH_TOKEN", "from-env")
    monkeypatch.delenv("NOTIFLOW_TENANTS", raising=False)
    return directory


def token(settings: Settings) -> str | None:
    secret = settings.twilio.auth_token
    return None if secret is None else secret.get_secret_value()


def test_the_directory_is_read_like_the_environment_and_wins(secrets: Path) -> None:
    write(secrets, "NOTIFLOW_TWILIO__AUTH_TOKEN", "from-dir\n")
    write(secrets, "notiflow_tenants", json.dumps([{"id": "acme", "token": "t1" * 16}]))
    loaded = Settings()
    assert token(loaded) == "from-dir"
    assert loaded.twilio.account_sid == "AC" + "1" * 32
    assert [t.id for t in loaded.tenants] == ["acme"]
    assert loaded.secrets_dir == secrets


def test_a_kubernetes_secret_volume_is_followed_through_its_symlinks(secrets: Path) -> None:
    for version, value in (("..v1", "one"), ("..v2", "two")):
        (secrets / version).mkdir()
        (secrets / version / "NOTIFLOW_TWILIO__AUTH_TOKEN").write_text(value)
    (secrets / "..data").symlink_to("..v1")
    (secrets / "NOTIFLOW_TWILIO__AUTH_TOKEN").symlink_to("..data/NOTIFLOW_TWILIO__AUTH_TOKEN")
    before = fingerprint(secrets)
    assert token(Settings()) == "one"
    (secrets / "..data_tmp").symlink_to("..v2")
    os.replace(secrets / "..data_tmp", secrets / "..data")
    assert fingerprint(secrets) != before
    assert token(Settings()) == "two"


def test_a_missing_directory_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setenv("NOTIFLOW_SECRETS_DIR", str(tmp_path / "absent"))
    with pytest.raises(Exception, match="absent"):
        Settings()


def test_the_fingerprint_follows_names_and_contents_of_notiflow_files_only(secrets: Path
                                                                           ) -> None:
    write(secrets, "NOTIFLOW_A", "1")
    first = fingerprint(secrets)
    write(secrets, "README", "not a setting")
    assert fingerprint(secrets) == first
    write(secrets, "NOTIFLOW_A", "2")
    second = fingerprint(secrets)
    assert second != first
    (secrets / "NOTIFLOW_A").rename(secrets / "NOTIFLOW_B")
    assert fingerprint(secrets) not in (first, second)


async def test_a_change_reloads_and_a_broken_one_keeps_what_is_in_force(secrets: Path
                                                                        ) -> None:
    write(secrets, "NOTIFLOW_TWILIO__AUTH_TOKEN", "old")
    ring = Keyring(Settings())
    seen: list[Reload] = []

    async def on_reload(change: Reload) -> None:
        seen.append(change)

    watch = watcher(ring, on_reload)
    assert watch is not None and watch.poll_s == 10
    assert await watch.check() is None
    write(secrets, "NOTIFLOW_TWILIO__AUTH_TOKEN", "new")
    assert await watch.check() == Reload(("twilio",))
    assert token(ring.settings) == "new"
    assert [s.auth_token.get_secret_value() for s in ring.sections("twilio")] == ["new", "old"]
    write(secrets, "NOTIFLOW_TENANTS", "[{not json")
    assert await watch.check() is None
    assert token(ring.settings) == "new"
    write(secrets, "NOTIFLOW_TENANTS", "[]")
    write(secrets, "NOTIFLOW_KAFKA_BOOTSTRAP", "elsewhere:9092")
    assert await watch.check() == Reload((), ("kafka_bootstrap",))
    assert seen == [Reload(("twilio",))]


def test_no_directory_no_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFLOW_SECRETS_DIR", raising=False)
    assert watcher(Keyring(Settings())) is None
