"""A provider's "this recipient is dead" is never lost: the send step writes the suppression
(or the dead token's deactivation) before the outcome leaves, retrying while the store or
the preference topic is down and stopping the flow (the record is sent again) when it stays
down; any other failure is a dead letter. The reconciler suppresses before it records the
receipt as seen, so a failed suppression is retried with the batch."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet

from notiflow.adapters.cassandra.attempts import ProviderIndexRow, ReceiptRecord
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.adapters.rows import AttemptRow, MessageHeadRow, MessageRow
from notiflow.flows.common.items import SourcedReceipt, SourceRef, Work
from notiflow.flows.receipts.reconcile import ApplyStep
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.context import InfraUnavailable, SendContext
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, Receipt, StatusEvent
from notiflow.settings import Settings
from tests.fakes import Producer, SleepingClock
from tests.helpers import partial_ports
from tests.unit.test_dead_recipients import FakeStore

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TOKEN = "f" * 64


class FlakyPreferences:
    """A preference store that fails the first ``failures`` writes with ``error``."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.tries: list[tuple[str, str]] = []
        self.written: list[tuple[str, str, str]] = []

    def _try(self, what: str, key: str) -> None:
        self.tries.append((what, key))
        if len(self.tries) <= self.failures:
            raise self.error

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: str) -> None:
        self._try("suppress", recipient_hash)
        self.written.append(("suppress", recipient_hash, reason))

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str, *,
                               older: tuple[str, ...] = ()) -> None:
        self._try("deactivate_token", token_hash)
        self.written.append(("deactivate_token", token_hash, reason))


class Leases:
    def __init__(self) -> None:
        self.finished: list[dict[str, object]] = []

    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"lease:{message_id}:{attempt}"

    def gate_key(self, message_id: str) -> str:
        return f"gate:{message_id}"

    async def finish(self, items: list[tuple[str, dict[str, object]]], ttl: timedelta,
                     clear: list[str]) -> None:
        self.finished += [done for _, done in items]

    async def release_content(self, items: list[tuple[str, str]]) -> None:
        return None


def context(prefs: FlakyPreferences, leases: Leases) -> SendContext:
    settings = Settings()
    ctx = SendContext(settings, Tier.P1, settings.policy(Tier.P1),
                      DlqCipher(Fernet.generate_key()), lambda: NOW, random.Random(1),
                      "send.p1")
    ctx.attach(partial_ports(preferences=prefs, leases=leases))
    return ctx


def work(channel: str = "EMAIL", recipient: Any = "gone@example.com") -> Work:
    doc = {"channel": channel, "tier": "P1", "recipient": recipient, "template_id": "t",
           "template_version": 1, "tenant_id": "acme", "category": "transactional",
           "message_id": "msg_1", "accepted_at": NOW.isoformat(),
           "expires_at": (NOW + timedelta(hours=1)).isoformat()}
    return Work(IngestRecord.model_validate(doc), SourceRef("ingest.email.p1", 0, 7), b"{}",
                None)


def dead(provider: str = "sendgrid", reason: str = "invalid_recipient") -> SendResult:
    return SendResult(Outcome.PERMANENT, provider, NOW, NOW, reason=reason,
                      deactivate_recipient=True)


def classify(prefs: FlakyPreferences, w: Work, result: SendResult) -> tuple[list[Any], Leases]:
    """Run the step with a 60 s retry budget on a clock that its sleep moves on."""
    leases = Leases()
    clock = SleepingClock()

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    step = Classify(retry_for=timedelta(seconds=60), sleep=sleep, monotonic=clock)
    outs = asyncio.run(step.classify(context(prefs, leases), w, result, None))
    return outs, leases


def test_a_suppression_is_retried_while_the_store_is_down_then_written() -> None:
    prefs = FlakyPreferences(3, ConnectionError("cassandra down"))
    w = work()
    outs, _ = classify(prefs, w, dead())
    assert prefs.written == [("suppress", w.recipient_hash, "hard_bounce")]
    assert len(prefs.tries) == 4
    [event] = outs
    assert isinstance(event, StatusEvent) and event.status is Status.FAILED


@pytest.mark.parametrize("error", [ConnectionError("cassandra down"),
                                   DeliveryFailed("preferences topic: not acknowledged"),
                                   TimeoutError()])
def test_a_store_down_for_good_stops_the_flow_instead_of_dropping_the_write(
        error: BaseException) -> None:
    """The outcome never leaves without its suppression: the flow stops
    (:class:`InfraUnavailable`), and the record is sent and written again on restart."""
    prefs = FlakyPreferences(10**6, error)
    with pytest.raises(InfraUnavailable):
        classify(prefs, work(), dead())
    assert prefs.written == []


def test_a_dead_push_tokens_deactivation_is_retried_too() -> None:
    prefs = FlakyPreferences(1, ConnectionError("cassandra down"))
    w = work("PUSH", {"device_token": TOKEN, "platform": "ios"})
    classify(prefs, w, dead("apns", "unregistered"))
    assert prefs.written == [("deactivate_token", w.recipient_hash, "apns:unregistered")]


def test_any_other_write_failure_is_a_dead_letter_that_leaves_with_the_outcome() -> None:
    prefs = FlakyPreferences(1, ValueError("no such column"))
    outs, leases = classify(prefs, work(), dead())
    event, letter = outs
    assert isinstance(event, StatusEvent) and event.status is Status.FAILED
    assert isinstance(letter, DlqRecord)
    assert (letter.error_class, letter.category, letter.tenant_id) == (
        "suppression_not_recorded", "bug", "acme")
    assert "gone@example.com" not in letter.reason
    [done] = leases.finished
    assert done["dlq"]["error_class"] == "suppression_not_recorded"  # type: ignore[index]


def test_a_failed_device_row_update_is_raised_for_the_caller_to_retry() -> None:
    store = FakeStore(fail_devices=True)
    prefs = PreferenceStore(store, Producer(), topic="notify.preferences")  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        asyncio.run(prefs.deactivate_token("acme", "h1", "fcm:unregistered"))
    assert [call[0] for call in store.calls] == ["suppress", "deactivate_token"]


# the reconciler ----------------------------------------------------------------------------


class ReceiptStore:
    """What ``ApplyStep._receipts_at_once`` reads and writes, in memory: a receipt is seen
    once its dedup row was written."""

    @property
    def messages(self) -> ReceiptStore:
        return self

    @property
    def delivery(self) -> ReceiptStore:
        return self

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    async def message_for_provider_id(self, provider_id: str, pmid: str) -> ProviderIndexRow:
        return ProviderIndexRow(provider_id, pmid, "msg_1", 1)

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        return []

    async def heads(self, ids: list[str]) -> list[MessageHeadRow]:
        return [MessageHeadRow(status="PROVIDER_ACCEPTED") for _ in ids]

    async def receipt_records(self, keys: list[tuple[str, str]]) -> list[ReceiptRecord | None]:
        return [ReceiptRecord(NOW) if k in self.seen else None for k in keys]

    def planned_transition(self, *args: Any, head: MessageHeadRow) -> tuple[bool, list[Any]]:
        return True, []

    def receipt_writes(self, provider_id: str, event_id: str, *args: Any) -> list[Any]:
        return [("dedup", provider_id, event_id)]

    def event_write(self, *args: Any) -> Any:
        return ("event", args[2])

    async def write_each(self, groups: list[list[Any]]) -> list[None]:
        for group in groups:
            for w in group:
                if w[0] == "dedup":
                    self.seen.add((w[1], w[2]))
        return []

    async def get_message(self, message_id: str) -> MessageRow:
        return MessageRow(message_id, tenant_id="acme", recipient_hash="h1")


class Suppressions:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[tuple[str, str, str]] = []

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: str) -> None:
        if self.failures:
            self.failures -= 1
            raise DeliveryFailed("preferences topic: not acknowledged")
        self.written.append((tenant_id, recipient_hash, reason))


def test_a_bounce_whose_suppression_failed_is_suppressed_when_the_batch_is_retried() -> None:
    store = ReceiptStore()
    step = ApplyStep(Settings(dlq_key=Fernet.generate_key().decode()),
                     DlqCipher(Fernet.generate_key().decode()), clock=lambda: NOW)
    prefs = step._preferences = Suppressions(failures=1)
    bounce = Receipt(provider_id="sendgrid", provider_event_id="ev1",
                     provider_message_id="pm1", status=Status.BOUNCED, occurred_at=NOW)
    wave = [SourcedReceipt(bounce, SourceRef("notify.receipts", 0, 1), b"{}")]

    async def batch_twice() -> None:
        with pytest.raises(DeliveryFailed):
            await step._receipts_at_once(wave, store)  # type: ignore[arg-type]
        await step._receipts_at_once(wave, store)  # type: ignore[arg-type]

    asyncio.run(batch_twice())
    assert prefs.written == [("acme", "h1", "hard_bounce")]
