"""The contract every provider adapter keeps, run for each harness of ``HARNESSES``: accepted
sends, permanent rejections, wrong credentials, rate limits, server errors, outages, timeouts,
refused connections and the emulator knobs; and Twilio-style per-message status callbacks for
the harnesses with a :class:`CallbackSpec`. A provider's own cases are in its
``test_contract_<provider>.py``, beside its harness (see :mod:`.harness`)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from notiflow.adapters.providers.base import Outcome
from notiflow.devenv import free_port
from notiflow.settings import Settings
from tests.helpers import wait_until
from tests.integration.contract.harness import (
    Emulator,
    Harness,
    Receiver,
    Rejection,
    TimedClient,
    _ids,
    assert_result,
    message,
    send_once,
)

pytestmark = pytest.mark.integration


def provider_harnesses() -> list[Harness]:
    """Every :class:`Harness` defined by a provider's ``test_contract_<provider>.py`` next to
    this module (``test_contract_chat.py`` holds Slack's and Teams'), in file order."""
    found: dict[int, Harness] = {}
    for name in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        if name.startswith("test_contract_") and name != Path(__file__).stem:
            module = importlib.import_module(f"tests.integration.contract.{name}")
            found.update({id(v): v for v in vars(module).values() if isinstance(v, Harness)})
    return list(found.values())


HARNESSES = provider_harnesses()
HTTP_HARNESSES = [h for h in HARNESSES if h.http]
CALLBACK_HARNESSES = [h for h in HARNESSES if h.callbacks is not None]
REJECTIONS = [(h, r) for h in HARNESSES for r in h.rejections]


@pytest.fixture(params=HARNESSES, ids=_ids)
def harness(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.param
    return harness


# the contract (every harness) ----------------------------------------------------------------


async def test_accepted(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    msg = message(harness, attempt=2)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    assert result.provider_message_id is not None
    assert harness.provider_message_id.fullmatch(result.provider_message_id)
    assert result.provider_id == adapter.provider_id
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted"
    assert record["sid"] == result.provider_message_id
    assert (record["attempt"], record["to"], record["body"]) == (
        2, harness.recorded(msg.recipient), msg.body)


@pytest.mark.parametrize("harness", [h for h in HARNESSES if h.sender], ids=_ids)
async def test_a_messages_own_sender_is_what_the_recipient_sees(
        harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    assert harness.sender is not None
    named, field, shown = harness.sender
    own = message(harness)
    msg = message(harness, sender=named)
    for m in (own, msg):
        assert_result(await adapter.send(m), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert record[field] == shown
    [default] = await emulator.records(own.message_id)
    assert default[field] not in (None, shown)


@pytest.mark.parametrize(("harness", "rejection"), REJECTIONS, ids=_ids)
async def test_recipient_rejected_permanently(harness: Harness, rejection: Rejection,
                                              adapter: TimedClient,
                                              emulator: Emulator) -> None:
    msg = message(harness, rejection.scenario)
    result = await adapter.send(msg)
    assert_result(result, Outcome.PERMANENT, rejection.reason)
    assert result.deactivate_recipient is rejection.deactivate
    assert result.provider_message_id is None
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] != "accepted"


async def test_empty_body(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    result = await adapter.send(message(harness, body=""))
    if harness.empty_body_rule is None:
        assert_result(result, Outcome.ACCEPTED, None)
    else:
        assert_result(result, *harness.empty_body_rule)


@pytest.mark.parametrize("harness", [h for h in HARNESSES if h.credentials], ids=_ids)
async def test_wrong_credentials(harness: Harness, provider_settings: Settings,
                                 emulator: Emulator) -> None:
    raw = await harness.unauthorized(provider_settings)
    assert raw.status_code == harness.unauthorized_status
    assert raw.json() == dict(harness.unauthorized_body)
    wrong = harness.configure(provider_settings, {"secret": harness.wrong_secret()})
    msg = message(harness)
    result = await send_once(harness, wrong, msg)
    assert_result(result, *harness.auth_rule)
    assert result.deactivate_recipient is False
    records = await emulator.records(msg.message_id)
    assert [r["outcome"] for r in records] == list(harness.unauthorized_records)


async def test_rate_limited_honours_retry_after(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    knobs: dict[str, Any] = {"error_rate_429": 1.0}
    if harness.retry_after:
        knobs["retry_after_s"] = 7
    await emulator.configure(**knobs)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "rate_limited")
    if not harness.retry_after:
        assert result.retry_after_s is None
        return
    assert result.retry_after_s is not None
    if harness.exact_retry_after:
        assert result.retry_after_s == 7.0
    else:
        assert abs(result.retry_after_s - 7.0) <= 1.0


@pytest.mark.parametrize("harness", HTTP_HARNESSES, ids=_ids)
@pytest.mark.parametrize(("status", "outcome"), [(503, Outcome.TRANSIENT),
                                                 (500, Outcome.AMBIGUOUS)])
async def test_server_errors(harness: Harness, adapter: TimedClient, emulator: Emulator,
                             status: int, outcome: Outcome) -> None:
    await emulator.configure(error_rate_5xx=1.0, statuses_5xx=[status])
    for _ in range(3):
        result = await adapter.send(message(harness))
        assert_result(result, outcome, "server_error")
        assert result.provider_message_id is None
    assert (await emulator.stats())["accepted"] == 0


async def test_outage_is_transient(harness: Harness, adapter: TimedClient,
                                   emulator: Emulator) -> None:
    await emulator.configure(outage=True)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "server_error")
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"]) == (1, 0)


async def test_accepted_then_timeout_is_ambiguous(harness: Harness, provider_settings: Settings,
                                                  emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    msg = message(harness)
    result = await send_once(harness, provider_settings, msg, timeout=0.4)
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert result.provider_message_id is None
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["hung"]) == (1, 1, 1)
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted" and record["hang"] is True


async def test_per_call_timeout_override(harness: Harness, provider_settings: Settings,
                                         emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    result = await send_once(harness, provider_settings, message(harness), timeout=10.0,
                             call_timeout=0.3)
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert (result.completed_at - result.started_at).total_seconds() < 2.0


async def test_connection_refused_is_transient(harness: Harness, provider_settings: Settings,
                                               emulator: Emulator) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    dead = harness.configure(provider_settings, {"base_url": base})
    msg = message(harness) if harness.rebase is None else message(
        harness, recipient=harness.rebase(harness.recipients["ok"], base))
    result = await send_once(harness, dead, msg, timeout=2.0)
    assert_result(result, Outcome.TRANSIENT, "connect_error")
    assert (await emulator.stats())["received"] == 0


async def test_latency_knob(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    await emulator.configure(latency_ms=200, latency_jitter_ms=0)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.ACCEPTED, None)
    assert (result.completed_at - result.started_at).total_seconds() >= 0.19


async def test_duplicates_are_counted(harness: Harness, adapter: TimedClient,
                                      emulator: Emulator) -> None:
    msg = message(harness)
    for _ in range(2):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    await adapter.send(message(harness))
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["duplicates"]) == (3, 3, 1)
    assert stats["by_message_id"] == {"distinct": 2, "accepted_histogram": {"1": 1, "2": 1}}


async def test_retention_is_bounded(harness: Harness, adapter: TimedClient,
                                    emulator: Emulator) -> None:
    await emulator.configure(max_records=2)
    first, second = message(harness), message(harness)
    for msg in (first, second, second):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["retained"]) == (3, 3, 2)
    assert stats["duplicates"] == 1
    assert stats["by_message_id"] == {"distinct": 1, "accepted_histogram": {"2": 1}}
    assert await emulator.records(first.message_id) == []


async def test_knobs_round_trip(emulator: Emulator) -> None:
    defaults = await emulator.config()
    changed = await emulator.configure(latency_ms=5, error_rate_429=0.5)
    assert (changed["latency_ms"], changed["error_rate_429"]) == (5, 0.5)
    assert await emulator.config() == changed
    bad = await emulator.http.post(f"{emulator.base}/_admin/{emulator.admin}/config",
                                   json={"error_rate_5xx": 2})
    assert bad.status_code == 400
    unknown = await emulator.http.post(f"{emulator.base}/_admin/{emulator.admin}/config",
                                       json={"no_such_knob": 1})
    assert unknown.status_code == 400
    assert await emulator.config() == changed
    await emulator.reset()
    assert await emulator.config() == defaults


async def test_reset_clears_every_emulator(fakes: str, settings: Settings) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        emulators = [Emulator(fakes, h.name, http) for h in HARNESSES]
        for emu in emulators:
            await emu.configure(latency_ms=1)
        await emulators[0].reset()
        for emu in emulators:
            assert (await emu.config())["latency_ms"] == 0


# per-message status callbacks (Twilio style) ---------------------------------------------------


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_status_callbacks_are_signed(harness: Harness, adapter: TimedClient,
                                           emulator: Emulator, receiver: Receiver,
                                           provider_settings: Settings) -> None:
    spec = harness.callbacks
    assert spec is not None
    await emulator.configure(callback_delay_ms=10)
    msg = message(harness, attempt=3)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    secret = spec.secret(provider_settings)
    for call in calls:
        assert f"attempt={msg.attempt}" in call.url
        assert call.params[spec.message_id_field] == result.provider_message_id
        assert spec.verify(secret, call.url, call.params, call.headers)
        tampered = {**call.params, spec.status_field: "read"}
        assert not spec.verify(secret, call.url, tampered, call.headers)
        assert not spec.verify("wrong", call.url, call.params, call.headers)
    assert {c.params[spec.status_field] for c in calls} == {"sent", spec.final_statuses[0]}


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_undelivered_callback_carries_error(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator,
                                                  receiver: Receiver) -> None:
    spec = harness.callbacks
    assert spec is not None
    await emulator.configure(callback_delay_ms=10, undelivered_rate=1.0)
    msg = message(harness)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    final = [c for c in calls if c.params[spec.status_field] != "sent"]
    assert [c.params[spec.status_field] for c in final] == [spec.final_statuses[1]]
    assert final[0].params[spec.error_field]


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_callback_failures_never_break_the_emulator(harness: Harness,
                                                          provider_settings: Settings,
                                                          emulator: Emulator) -> None:
    await emulator.configure(callback_delay_ms=0)
    dead = harness.configure(provider_settings,
                             {"callback_url": f"http://127.0.0.1:{free_port()}/gone"})
    client = await harness.open(dead, 5.0)
    try:
        for _ in range(3):
            assert_result(await client.send(message(harness)), Outcome.ACCEPTED, None)

        async def failed() -> int | None:
            n = int((await emulator.stats())["callbacks"]["failed"])
            return n if n >= 6 else None

        assert await wait_until(failed, timeout=10, interval=0.05,
                                what="six failed callbacks") == 6
        assert_result(await client.send(message(harness)), Outcome.ACCEPTED, None)
    finally:
        await client.aclose()
    health = await emulator.http.get(f"{emulator.base}/_admin/health")
    assert health.status_code == 200
