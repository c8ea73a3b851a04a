"""One-click unsubscribe against the real API: the page a person sees changes nothing, the
POST a mailbox provider sends opts the address out of the link's category on email (stored
and published), again and again without another change, and a forged link is refused."""

from __future__ import annotations

import email.message
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import httpx
import pytest

from notiflow.correlation import CorrelationKeys
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Category
from notiflow.settings import Settings
from notiflow.unsubscribe import ONE_CLICK, UnsubscribeKeys, Unsubscription

pytestmark = pytest.mark.integration

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def link_for(settings: Settings, tenant: str, address: str, category: Category,
             issued: datetime | None = None) -> str:
    keys = UnsubscribeKeys.of(CorrelationKeys.from_settings(settings))
    return "/unsubscribe/" + keys.issue(Unsubscription(
        tenant, recipient_hash(tenant, address), category, issued or datetime.now(UTC)))


def preferences(client: httpx.Client, auth: Callable[..., dict[str, str]],
                address: str) -> dict[str, object]:
    r = client.get(f"/v1/recipients/{quote(address, safe='')}/preferences",
                   headers=auth("acme"))
    return r.json() if r.status_code == 200 else {}


def test_the_page_asks_and_the_post_opts_out(client: httpx.Client, stack: Settings,
                                             auth: Callable[..., dict[str, str]]) -> None:
    address = f"reader-{uuid.uuid4().hex[:8]}@example.com"
    link = link_for(stack, "acme", address, Category.MARKETING)
    page = client.get(link)
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert '<form method="post">' in page.text and "marketing" in page.text
    assert address not in page.text
    assert preferences(client, auth, address) == {}

    r = client.post(link, content=ONE_CLICK, headers=FORM)
    assert r.status_code == 200, r.text
    stored = preferences(client, auth, address)
    assert stored["opt_outs"] == [{"channel": "EMAIL", "category": "marketing"}]
    again = client.post(link, content=ONE_CLICK, headers=FORM)
    assert again.status_code == 200
    assert preferences(client, auth, address)["version"] == stored["version"]


def test_forged_expired_and_foreign_links_are_unknown(client: httpx.Client,
                                                      stack: Settings) -> None:
    link = link_for(stack, "acme", "ana@example.com", Category.MARKETING)
    head, _, signature = link.rpartition(".")
    forged = f"{head}.{'A' * len(signature)}"
    old = link_for(stack, "acme", "ana@example.com", Category.MARKETING,
                   datetime.now(UTC) - stack.unsubscribe.max_age - timedelta(days=1))
    for url in (forged, old, "/unsubscribe/a.b.c"):
        r = client.post(url, content=ONE_CLICK, headers=FORM)
        assert (r.status_code, r.json()) == (404, {"error": "not_found"}), url
        assert client.get(url).status_code == 404


def test_a_mail_to_the_mailto_link_opts_out_and_anything_else_changes_nothing(
        client: httpx.Client, stack: Settings, auth: Callable[..., dict[str, str]]) -> None:
    address = f"reader-{uuid.uuid4().hex[:8]}@example.com"
    token = link_for(stack, "acme", address, Category.MARKETING).removeprefix("/unsubscribe/")
    secret = stack.smtp.dsn_webhook_secret
    assert secret is not None
    pipe = {"Authorization": f"Bearer {secret.get_secret_value()}",
            "Content-Type": "message/rfc822"}

    def mailed(subject: str) -> bytes:
        msg = email.message.EmailMessage()
        msg["From"], msg["To"] = address, stack.unsubscribe.mailto or ""
        msg["Subject"] = subject
        msg.set_content("")
        return msg.as_bytes()

    junk = client.post("/webhooks/unsubscribe-mail", content=mailed("hello"), headers=pipe)
    assert (junk.status_code, junk.json()) == (200, {"unsubscribed": 0})
    forged = client.post("/webhooks/unsubscribe-mail", headers=pipe,
                         content=mailed(f"unsubscribe {token[:-4]}AAAA"))
    assert forged.json() == {"unsubscribed": 0}
    assert preferences(client, auth, address) == {}
    stranger = client.post("/webhooks/unsubscribe-mail", content=mailed(f"unsubscribe {token}"),
                           headers={**pipe, "Authorization": "Bearer not-the-secret"})
    assert stranger.status_code == 403

    r = client.post("/webhooks/unsubscribe-mail", content=mailed(f"unsubscribe {token}"),
                    headers=pipe)
    assert (r.status_code, r.json()) == (200, {"unsubscribed": 1})
    assert preferences(client, auth, address)["opt_outs"] == [
        {"channel": "EMAIL", "category": "marketing"}]
