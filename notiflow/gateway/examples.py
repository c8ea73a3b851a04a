"""Example bodies of the OpenAPI document (``openapi.py``): requests that the API accepts
once their template exists, and answers as it gives them."""

from __future__ import annotations

from typing import Any, Final

SMS: Final[dict[str, Any]] = {
    "channel": "SMS", "tier": "P1", "recipient": "+14155550123", "template_id": "otp",
    "template_version": 1, "variables": {"code": "123456"}, "category": "otp"}
EMAIL: Final[dict[str, Any]] = {
    "channel": "EMAIL", "tier": "P3", "recipient": "ana@example.com",
    "template_id": "weekly-digest", "template_version": 1, "variables": {"name": "Ana"},
    "category": "marketing"}
PUSH: Final[dict[str, Any]] = {
    "channel": "PUSH", "tier": "P2", "template_id": "order-shipped", "template_version": 1,
    "recipient": {"platform": "android", "device_token": "f" * 32 + ":APA91b-example"},
    "variables": {"order": "A-1042"}}
SEND: Final = {"sms": SMS, "email": EMAIL, "push": PUSH}

ACCEPTED: Final = {"queued": {"message_id": "msg_3f0c2b6e0d3a4d3f9c1b2a7e5d4c3b2a",
                              "status": "QUEUED", "accepted_at": "2026-12-01T09:30:00.125Z"}}

BATCH: Final = {"two": {"messages": [{**SMS, "idempotency_key": "order-1042-otp"}, EMAIL]}}
BATCH_RESULTS: Final = {"mixed": {"results": [
    {"code": 202, **ACCEPTED["queued"]},
    {"code": 422, "error": "validation_failed", "reason": "unknown_template",
     "message": "template weekly-digest version 1 does not exist"}]}}

TEMPLATE: Final = {"otp": {"template_id": "otp", "channel": "SMS",
                           "body": "Your code is {{ code }}"}}
PREFERENCES: Final = {"quiet": {"timezone": "Europe/Paris",
                                "quiet_hours": {"start": "22:00", "end": "07:00"},
                                "opt_outs": [{"channel": "*", "category": "marketing"}]}}
DEVICE: Final = {"android": {"platform": "android"}}
SCHEDULE: Final = {"weekdays": {
    "rrule": "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=30;BYSECOND=0",
    "timezone": "Europe/Paris", "message": {**EMAIL, "tier": "P3"}}}
TOPIC_SEND: Final = {"release": {
    "name": "release 2.4", "tier": "P3", "category": "marketing",
    "channels": [{"channel": "PUSH", "template_id": "release-push", "template_version": 1},
                 {"channel": "EMAIL", "template_id": "release-mail", "template_version": 1}],
    "deliver": "first", "variables": {"version": "2.4"}, "max_rate": 500}}
CAMPAIGN: Final = {"winter": {
    "name": "winter sale", "channel": "SMS", "tier": "P3", "category": "marketing",
    "template_id": "winter", "template_version": 1,
    "manifest": "s3://notiflow/tenants/mkt/winter.csv",
    "mapping": {"recipient": "phone", "variables": {"name": "first_name"}},
    "window": {"start": "10:00", "end": "20:00"}, "timezone": "Europe/Berlin",
    "max_rate": 500}}
