"""Tenant A's forgeries in ``notiflow chaos hostile-tenant``: receipts that try to change B's
messages, and ingest records written straight to a topic claiming to be B's."""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
from confluent_kafka import Producer

from notiflow.adapters.kafka_io import producer_config
from notiflow.ingest_binding import Signer
from notiflow.ops.chaos_hostile_attacks import TENANT_A, TENANT_B, Attack, answer_of
from notiflow.providers.twilio.signature import SIGNATURE_HEADER, signature
from notiflow.providers.vonage.signature import signature as vonage_signature
from notiflow.schemas.enums import Channel, Tier


async def receipts(attack: Attack, client: httpx.AsyncClient) -> None:
    """Receipts that try to fail B's messages: unsigned or badly signed posts to every
    receipt route, and receipts signed with the platform's own provider secrets whose hint
    names B's message while their provider message id is one of A's (or made up)."""
    s = attack.phase.settings
    bulk = attack.phase.bulk_api
    for target in attack.b_targets:
        mid, pmid = target["message_id"], target["provider_message_id"] or "SM0"
        form = {"MessageSid": pmid, "MessageStatus": "undelivered", "ErrorCode": "30005"}
        query = urlencode({"message_id": mid, "attempt": "1"})
        for name, headers in (("unsigned", {}), ("bad signature", {SIGNATURE_HEADER: "x" * 28})):
            r = await client.post(f"{bulk}/webhooks/twilio?{query}", data=form, headers=headers)
            attack.tally(f"twilio receipt {name}", answer_of(r))
        dlr = {"messageId": pmid, "status": "failed", "err-code": "6",
               "client-ref": f"{mid}:1", "api-key": s.vonage.api_key or "",
               "timestamp": str(int(time.time()))}
        r = await client.post(f"{bulk}/webhooks/vonage", data=dlr)
        attack.tally("vonage receipt unsigned", answer_of(r))
        r = await client.post(f"{bulk}/webhooks/vonage", data={**dlr, "sig": "0" * 64})
        attack.tally("vonage receipt bad signature", answer_of(r))
        r = await client.post(f"{bulk}/webhooks/sendgrid", json=[{
            "event": "bounce", "sg_message_id": pmid, "message_id": mid, "attempt": 1,
            "timestamp": int(time.time())}])
        attack.tally("sendgrid receipt unsigned", answer_of(r))
        r = await client.post(f"{bulk}/webhooks/smtp-dsn", content=b"x",
                              headers={"Authorization": "Bearer forged"})
        attack.tally("smtp dsn wrong secret", answer_of(r))
        for own in [*attack.a_sent[:2], {"provider_id": target["provider_id"],
                                          "provider_message_id": f"SMforged{uuid.uuid4().hex}"}]:
            await _signed(attack, client, own, mid)


async def _signed(attack: Attack, client: httpx.AsyncClient, own: dict[str, Any],
                  victim: str) -> None:
    """A receipt the provider account's secret signs, for ``own``'s provider message id,
    whose hint names attempt 1 of ``victim``."""
    s = attack.phase.settings
    bulk = attack.phase.bulk_api
    pmid = str(own["provider_message_id"])
    if own["provider_id"] == s.vonage.provider_id and s.vonage.signature_secret:
        dlr = {"messageId": pmid, "status": "failed", "err-code": "6",
               "client-ref": f"{victim}:1", "api-key": s.vonage.api_key or "",
               "timestamp": str(int(time.time()))}
        dlr["sig"] = vonage_signature(s.vonage.signature_secret.get_secret_value(), dlr)
        r = await client.post(f"{bulk}/webhooks/vonage", data=dlr)
        action = "vonage receipt signed, hint names B"
    else:
        token = s.twilio.auth_token.get_secret_value() if s.twilio.auth_token else ""
        query = urlencode({"message_id": victim, "attempt": "1"})
        form = {"MessageSid": pmid, "MessageStatus": "undelivered", "ErrorCode": "30005"}
        signed_url = f"{s.twilio.status_callback_url or bulk + '/webhooks/twilio'}?{query}"
        r = await client.post(f"{bulk}/webhooks/twilio?{query}", data=form,
                              headers={SIGNATURE_HEADER: signature(token, signed_url, form)})
        action = "twilio receipt signed, hint names B"
    attack.tally(action, answer_of(r))
    if r.status_code == 200:
        attack.signed_forgeries += 1


def forged_ingest(attack: Attack) -> None:
    """``forged_ingest`` records written straight to the P1 SMS ingest topic by a producer
    of A's, claiming tenant B: half unsigned, half signed with A's own ingest key."""
    s = attack.phase.settings
    tenant = s.tenant(TENANT_A)
    keys = tenant.ingest_keys if tenant is not None else ()
    signer = Signer.of(keys[0].get_secret_value()) if keys else None
    producer = Producer(producer_config(s))
    topic = s.ingest_topic(Channel.SMS, Tier.P1)
    for i in range(attack.forged_ingest):
        mid = f"msg_forged{uuid.uuid4().hex}"
        value = orjson.dumps({"schema_version": 1, "message_id": mid, "tenant_id": TENANT_B,
                              "channel": "SMS", "tier": "P1", "category": "transactional",
                              "recipient": "+14155550123", "template_id": "x",
                              "template_version": 1, "variables": {}})
        headers: list[tuple[str, bytes]] = [("message_id", mid.encode()),
                                            ("tenant_id", TENANT_B.encode()),
                                            ("producer", b"hostile-a")]
        if signer is not None and i % 2:
            headers = signer.headers(headers, "SMS", "P1", value)
        producer.produce(topic, value, key=mid.encode(),
                         headers=[(k, v) for k, v in headers])
        producer.poll(0)
    left = producer.flush(30)
    attack.tally("forged ingest record claiming B", f"written {attack.forged_ingest - left}")
