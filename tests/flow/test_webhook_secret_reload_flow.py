"""A tenant's webhook signing secret rotated in the secrets directory (a mounted Kubernetes
Secret) while the client webhook flow runs: the dispatcher's watcher reloads it, and the
next webhook is signed with the new secret only, without a restart."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from bytewax.testing import TestingSink, TestingSource, run_main

from notiflow.adapters.kafka_io import OutRecord
from notiflow.bench.webhook_receiver import Receiver
from notiflow.devenv import webhook_secret
from notiflow.flows.webhooks.status_webhooks import build_webhook_flow
from notiflow.flows.webhooks.webhook_sender import WebhookDispatcher
from notiflow.secrets import Keyring
from notiflow.settings import Settings
from tests.flow.test_client_webhooks_flow import event, events, with_rule

pytestmark = pytest.mark.flow


def tenants_with(secret: str) -> str:
    tenants = json.loads(os.environ["NOTIFLOW_TENANTS"])
    for t in tenants:
        if t["id"] == "acme":
            t["webhook_secrets"] = [secret]
    return json.dumps(tenants)


def acme_secrets(keyring: Keyring) -> list[str]:
    tenant = keyring.settings.tenant("acme")
    assert tenant is not None
    return [s.get_secret_value() for s in tenant.webhook_secrets]


def test_a_rotated_signing_secret_takes_effect_without_a_restart(
        stack: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir()
    old, new = webhook_secret(), webhook_secret()
    (directory / "NOTIFLOW_TENANTS").write_text(tenants_with(old))
    monkeypatch.setenv("NOTIFLOW_SECRETS_DIR", str(directory))
    s = with_rule(stack, 0, 50, secrets_dir=directory,
                  secrets_poll=timedelta(milliseconds=50))
    keyring = Keyring(s)
    dispatcher = WebhookDispatcher(s, keyring=keyring)
    dispatcher.ready()
    try:
        aside = directory / ".tenants.tmp"
        aside.write_text(tenants_with(new))
        os.replace(aside, directory / "NOTIFLOW_TENANTS")
        deadline = time.monotonic() + 10
        while acme_secrets(keyring) != [new] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acme_secrets(keyring) == [new]
        mid = f"msg_{uuid.uuid4().hex}"
        out: list[OutRecord] = []
        with Receiver([new]) as rx:
            run_main(build_webhook_flow(
                s, source=TestingSource(events(s, [event(mid, "PROVIDER_ACCEPTED",
                                                         rx.url())])),
                sink=TestingSink(out), sender=dispatcher, keyring=keyring, eof_timeout=10))
            assert (mid, "PROVIDER_ACCEPTED") in rx.seen()
            assert all(h.valid for h in rx.hits)
        assert out == []
    finally:
        dispatcher.close()
