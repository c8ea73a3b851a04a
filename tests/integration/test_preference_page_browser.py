"""The hosted preference page in a real browser (Debian's Chromium, headless, JavaScript
off, driven by Selenium): a French user with SMS, email and an iPhone gets a P1 message on
push; they open the link the platform issued, see the page in French, untick "Commandes et
activité" on their phone and save; the next message goes by SMS, the JSON twin shows the
opt-out, and a forged link is a 404 page. Screenshots go to the session's log directory."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from notiflow.settings import Settings
from tests.helpers import fresh_email, fresh_ios_token, fresh_phone

pytestmark = pytest.mark.integration

TEMPLATES = {"PUSH": "page-push", "SMS": "page-sms"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "ops/bootstrap.sh installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=900,1100", "--lang=fr-FR"):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs", {"profile.managed_default_content_settings.javascript": 2})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def shots(log_dir: Path) -> Path:
    out = log_dir / "screenshots"
    out.mkdir(exist_ok=True)
    return out


def send(api: str, token: str, uid: str) -> dict[str, Any]:
    r = httpx.post(f"{api}/v1/messages", headers=bearer(token), json={
        "recipient": f"user:{uid}", "tier": "P1", "category": "transactional",
        "channels": [{"channel": c, "template_id": t, "template_version": 1}
                     for c, t in TEMPLATES.items()],
        "variables": {"order": "A-7"}})
    assert r.status_code == 202, r.text
    return dict(r.json())


def test_a_user_opts_out_of_push_on_the_page_and_the_next_message_goes_by_sms(
        api: str, tokens: dict[str, str], stack: Settings, browser: webdriver.Chrome,
        shots: Path) -> None:
    acme = tokens["acme"]
    for channel, template_id in TEMPLATES.items():
        r = httpx.post(f"{api}/v1/templates", headers=bearer(acme), json={
            "template_id": template_id, "version": 1, "channel": channel,
            "body": "Order {{ order }}: {{ preferences_url }}"})
        assert r.status_code in (200, 201), r.text
    uid = f"user-{uuid.uuid4().hex[:10]}"
    r = httpx.put(f"{api}/v1/users/{uid}", headers=bearer(acme), json={
        "phones": [fresh_phone()], "emails": [fresh_email()], "in_app": False,
        "devices": [{"platform": "ios", "token": fresh_ios_token()}], "locale": "fr-FR"})
    assert r.status_code == 201, r.text
    first = send(api, acme, uid)
    assert [m["channel"] for m in first["messages"]] == ["PUSH"]
    topic = f"releases-{uid}"
    r = httpx.put(f"{api}/v1/topics/{topic}/subscribers", headers=bearer(acme),
                  json={"users": [uid]})
    assert r.json() == {"subscribed": 1, "unknown": []}, r.text

    link = httpx.post(f"{api}/v1/users/{uid}/preferences:link", headers=bearer(acme))
    assert link.status_code == 200, link.text
    url = link.json()["url"]
    assert url.startswith(f"{stack.preference_page.base_url}/preferences/")

    browser.get(url)
    browser.save_screenshot(str(shots / "preferences-before.png"))
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "fr"
    assert browser.title == "Préférences de notification"
    boxes = browser.find_elements(By.CSS_SELECTOR, "input[name=receive]")
    assert len(boxes) == 9 and all(b.is_selected() for b in boxes)
    follows = browser.find_element(By.CSS_SELECTOR, f"input[name=hear][value='{topic}']")
    assert follows.is_selected()
    assert "Sujets suivis" in browser.page_source
    follows.click()
    labels = [b.find_element(By.XPATH, "./ancestor::label").text for b in boxes]
    assert "Notification sur le téléphone" in labels
    push = browser.find_element(By.CSS_SELECTOR, "input[value='transactional:PUSH']")
    push.click()
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    status = WebDriverWait(browser, 30).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "[role=status]")))
    assert status.text == "Vos préférences sont enregistrées."
    browser.save_screenshot(str(shots / "preferences-saved.png"))
    assert not browser.find_element(
        By.CSS_SELECTOR, "input[value='transactional:PUSH']").is_selected()

    second = send(api, acme, uid)
    assert [m["channel"] for m in second["messages"]] == ["SMS"]
    assert second["skipped"][0] == {"channel": "PUSH", "index": 0, "reason": "opted_out"}
    data = httpx.get(f"{url}/data")
    assert data.status_code == 200, data.text
    assert data.json()["opt_outs"] == [{"channel": "PUSH", "category": "transactional"}]
    assert data.json()["muted_topics"] == [topic]
    assert data.json()["channels"] == ["SMS", "EMAIL", "PUSH"]

    browser.get(url[:-4] + "AAAA")
    assert "Ce lien" not in browser.page_source and "no longer works" in browser.page_source
    browser.save_screenshot(str(shots / "preferences-forged.png"))
