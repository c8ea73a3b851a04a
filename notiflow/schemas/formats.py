"""JSON Schema of the rules the wire models check in code (recipient formats per channel,
device token shapes, variable names), so the exported schemas and the OpenAPI document
state what the validators accept. A rule no JSON Schema can state exactly is named in the
description (``format: e164``: libphonenumber's validity for the country code)."""

from __future__ import annotations

from typing import Any, Final
from zoneinfo import available_timezones

from notiflow.chat_hooks import WEBHOOK_URL_PATTERN

E164_PATTERN: Final = r"^\+[1-9][0-9]{6,14}$"
APNS_TOKEN_PATTERN: Final = r"^[0-9a-fA-F]{64,200}$"
FCM_TOKEN_PATTERN: Final = r"^[A-Za-z0-9_:\-]{32,4096}$"
TEMPLATE_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,127}$"
VARIABLE_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
SHORT_CODE_PATTERN: Final = r"^[0-9]{3,8}$"
TOPIC_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""A tenant's topic name: 1-128 letters, digits and ``._:-``, starting with a letter or
digit."""
INAPP_PATTERN: Final = r"^inapp:[A-Za-z0-9._@+:-]{1,128}$"
"""An in-app recipient: ``inapp:`` and the tenant's id of the user (1-128 characters)."""
ALPHANUMERIC_SENDER_PATTERN: Final = r"^[A-Za-z0-9 ]*[A-Za-z][A-Za-z0-9 ]*$"
"""An alphanumeric SMS sender id: letters, digits and spaces, at least one letter (at most
11 characters, ``maxLength``)."""

SPECIAL_USE_DOMAINS: Final = ("arpa", "invalid", "local", "localhost", "onion", "test")
"""Domains no message can be delivered to (RFC 6761; email-validator refuses them)."""


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c}]" for c in word)


PHONE: Final[dict[str, Any]] = {
    "type": "string", "format": "e164", "pattern": E164_PATTERN,
    "description": "E.164 phone number that is valid for its country code (libphonenumber), "
                   "e.g. +14155550123.",
    "examples": ["+14155550123"]}
_ATOM: Final = r'[^\x00-\x20\x7f"(),.:;<>@\[\\\]]+'
_LABEL: Final = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
EMAIL_PATTERN: Final = (rf"^{_ATOM}(\.{_ATOM})*@({_LABEL}\.)+"
                        r"[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
"""The shape every accepted address has: a dot-atom local part without the characters that
need quoting, then host labels (an ASCII domain whose last label starts with a letter).
``format: email`` is only an annotation in JSON Schema; this pattern is what a validator
checks."""
EMAIL: Final[dict[str, Any]] = {
    "type": "string", "format": "email", "maxLength": 254, "pattern": EMAIL_PATTERN,
    "not": {"pattern": "[@.](" + "|".join(map(_any_case, SPECIAL_USE_DOMAINS)) + r")\.?$"},
    "description": "Email address (RFC 5321; normalised and matched case-insensitively); "
                   "not at a special-use domain (`.test`, `.local`, `.invalid`, ...). An "
                   "internationalised domain is accepted beyond the pattern.",
    "examples": ["ana@example.com"]}
SMS_SENDER: Final[dict[str, Any]] = {
    "anyOf": [PHONE,
              {"type": "string", "pattern": SHORT_CODE_PATTERN,
               "description": "A short code (3-8 digits)."},
              {"type": "string", "pattern": ALPHANUMERIC_SENDER_PATTERN, "maxLength": 11,
               "description": "An alphanumeric sender id (1-11 letters, digits and spaces, "
                              "at least one letter)."}],
    "description": "What an SMS comes from: an E.164 number, a short code or an alphanumeric "
                   "sender id."}
SENDER_DESCRIPTION: Final = (
    "Who the message comes from, one of the senders the tenant may use (403 "
    "`sender_not_allowed` otherwise): for SMS an E.164 number, a short code or an "
    "alphanumeric sender id; for EMAIL the From address. Not for PUSH. Omitted: the provider "
    "account's own sender.")
HTTP_URL: Final[dict[str, Any]] = {
    "type": "string", "maxLength": 2083,
    "pattern": r"^https?://([a-z0-9-]{1,63}\.)*[a-z]{2,63}(:[1-9][0-9]{0,3})?(/[A-Za-z0-9._~/-]*)?$",
    "description": "An http or https URL (host names; the pattern is the part of URL syntax "
                   "that is promised to be accepted).",
    "examples": ["https://hooks.example.com/notiflow"]}

INAPP: Final[dict[str, Any]] = {
    "type": "string", "pattern": INAPP_PATTERN,
    "description": "`inapp:` and the tenant's own id of the user whose inbox gets the message "
                   "(letters, digits and `._@+:-`, 1-128 characters).",
    "examples": ["inapp:user-42"]}
WEBHOOK_URL: Final[dict[str, Any]] = {
    "type": "string", "maxLength": 2048, "pattern": WEBHOOK_URL_PATTERN,
    "description": "A Slack or Microsoft Teams incoming-webhook URL under one of the "
                   "prefixes a chat provider of the deployment serves (422 "
                   "`recipient_not_served` otherwise). Beyond the pattern: host labels of "
                   "letters, digits and inner hyphens, a port up to 65535, and a path without "
                   "dot segments, encoded slashes or dots, or control characters.",
    "examples": ["https://hooks.slack.com/services/T000/B000/XXXX"]}


WALL_TIME: Final[dict[str, Any]] = {
    "type": "string", "pattern": r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?$",
    "description": "Local wall-clock time, without an offset (`HH:MM[:SS[.ffffff]]`).",
    "examples": ["22:00"]}


def zone(*also: str) -> dict[str, Any]:
    """An IANA time zone this server knows (its tzdata), ``also`` values, or null."""
    names = sorted(available_timezones())
    return {"anyOf": [{"type": "string", "enum": [*also, *names]}, {"type": "null"}],
            "description": "An IANA time zone, e.g. Europe/Paris.", "default": None}


def wall_clock_window(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a local window: both ends wall-clock times."""
    schema["properties"]["start"] = WALL_TIME
    schema["properties"]["end"] = WALL_TIME


def zoned(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a body with an optional ``timezone``."""
    schema["properties"]["timezone"] = zone()


MANIFEST_NAME: Final = r"\.(" + "|".join(map(_any_case, ("csv", "jsonl", "ndjson"))) + ")$"


def _or_null(rule: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [rule, {"type": "null"}]}


def sender_property() -> dict[str, Any]:
    """The ``sender`` of a send request or a campaign (its form follows the channel)."""
    return {"anyOf": [{"type": "string", "maxLength": 254}, {"type": "null"}],
            "default": None, "description": SENDER_DESCRIPTION}


def campaign_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a campaign: its zone, a manifest format that is named or
    follows from the name, ``mapping.platform`` exactly for push, and the sender's form per
    channel."""
    zoned(schema)
    schema["properties"]["sender"] = sender_property()
    schema["properties"]["tier"] = {"enum": ["P2", "P3"], "default": "P3",
                                    "description": "Campaigns are P2 or P3."}
    schema["allOf"] = [
        {"anyOf": [{"required": ["format"], "properties": {"format": {"type": "string"}}},
                   {"properties": {"manifest": {"pattern": MANIFEST_NAME}}}]},
        {"oneOf": [
            {"properties": {"channel": {"const": "PUSH"}, "sender": {"type": "null"},
                            "mapping": {"required": ["platform"],
                                        "properties": {"platform": {"type": "string"}}}}},
            {"properties": {"channel": {"const": "SMS"}, "sender": _or_null(SMS_SENDER),
                            "mapping": {"properties": {"platform": {"type": "null"}}}}},
            {"properties": {"channel": {"const": "EMAIL"}, "sender": _or_null(EMAIL),
                            "mapping": {"properties": {"platform": {"type": "null"}}}}}]},
    ]


def recipient_address() -> dict[str, Any]:
    """A recipient as one string (a ``{recipient}`` path segment): phone, email address or
    ``<platform>:<device token>``."""
    return {"anyOf": [PHONE, EMAIL,
                      {"type": "string", "pattern": "^ios:" + APNS_TOKEN_PATTERN[1:]},
                      {"type": "string", "pattern": "^(android|web):" + FCM_TOKEN_PATTERN[1:]}],
            "description": "The address as in a send request, URL-encoded: an E.164 number, "
                           "an email address or `<ios|android|web>:<device token>`."}


def owner_address() -> dict[str, Any]:
    """A device owner: a phone number or an email address."""
    return {"anyOf": [PHONE, EMAIL],
            "description": "The device's owner: an E.164 number or an email address."}


def push_token_rule(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a push recipient: the token's shape follows the platform."""
    schema["properties"]["device_token"]["pattern"] = FCM_TOKEN_PATTERN
    schema["properties"]["device_token"]["description"] = (
        "APNs token (ios: 64-200 hex digits) or FCM / web push token (32-4096 of "
        "A-Z a-z 0-9 _ : -).")
    schema["oneOf"] = [
        {"properties": {"platform": {"const": "ios"},
                        "device_token": {"pattern": APNS_TOKEN_PATTERN}}},
        {"properties": {"platform": {"enum": ["android", "web"]}}},
    ]


LOCALE_PATTERN: Final = r"^[A-Za-z]{2,3}(-[A-Za-z]{4})?(-(?:[A-Za-z]{2}|[0-9]{3}))?$"
"""A BCP 47 language tag of language, optional script and optional region (``fr``,
``fr-CA``, ``zh-Hant-TW``, ``es-419``)."""
PROPERTY_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


def _one_shape_per(schema: dict[str, Any], shapes: list[dict[str, Any]]) -> None:
    """Restate ``schema`` as one whole object shape per entry of ``shapes`` (properties
    replacing the shared ones), so generators build each shape directly instead of
    filtering one shape by another's rules."""
    props, required = schema.pop("properties"), schema.pop("required", [])
    for key in ("additionalProperties", "type"):
        schema.pop(key, None)
    schema["oneOf"] = [{"type": "object", "properties": {**props, **shape},
                        "required": required, "additionalProperties": False}
                       for shape in shapes]


def user_device_rule(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a user's device: an ``ios`` token is 64-200 hex digits, an
    ``android`` or ``web`` token 32-4,096 of ``A-Z a-z 0-9 _ : -``."""
    token = schema["properties"]["token"]
    _one_shape_per(schema, [
        {"platform": {"const": "ios"},
         "token": {**token, "pattern": APNS_TOKEN_PATTERN, "minLength": 64, "maxLength": 200}},
        {"platform": {"enum": ["android", "web"]},
         "token": {**token, "pattern": FCM_TOKEN_PATTERN}}])


def _user_properties() -> dict[str, dict[str, Any]]:
    hook = {**WEBHOOK_URL, "description": "An incoming-webhook URL of a team chat. Beyond "
            "the pattern: host labels of letters, digits and inner hyphens, a port up to "
            "65535, and a path without dot segments, encoded slashes or dots, or control "
            "characters."}
    return {
        "phones": {"type": "array", "items": PHONE, "maxItems": 8, "uniqueItems": True},
        "emails": {"type": "array", "items": EMAIL, "maxItems": 8, "uniqueItems": True,
                   "description": "Listed once each, compared case-insensitively."},
        "chat_webhooks": {"type": "array", "items": hook, "maxItems": 4,
                          "uniqueItems": True},
        "locale": {"type": "string", "pattern": LOCALE_PATTERN, "maxLength": 20,
                   "description": "A BCP 47 tag: language, optional script and region."},
        "timezone": zone(),
        "properties": {"type": "object", "maxProperties": 64,
                       "propertyNames": {"pattern": PROPERTY_NAME_PATTERN},
                       "additionalProperties": {"type": ["string", "number", "boolean",
                                                         "null"]},
                       "description": "The tenant's own attributes (at most 8 KiB as "
                                      "JSON)."},
    }


def _unique_devices(devices: dict[str, Any]) -> None:
    for rule in devices.get("anyOf", [devices]):
        if rule.get("type") == "array":
            rule["uniqueItems"] = True


def _user_fields(schema: dict[str, Any], *, nullable: tuple[str, ...]) -> None:
    props = schema["properties"]
    _unique_devices(props["devices"])
    for name, rule in _user_properties().items():
        keep = {k: props[name][k] for k in ("default", "title") if k in props[name]}
        props[name] = {**keep, **(_or_null(rule) if name in nullable else rule)}


def user_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a whole user profile."""
    _user_fields(schema, nullable=("locale",))


def user_patch_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a merge patch of a user: each field may also be null."""
    _user_fields(schema, nullable=tuple(n for n in _user_properties() if n != "timezone"))


def _message_fields(props: dict[str, Any]) -> None:
    """``variables`` and ``status_webhook`` of a send request, whoever it is addressed to."""
    _variables(props)
    props["status_webhook"] = {"anyOf": [HTTP_URL, {"type": "null"}],
                               "description": "Receives a signed event at every status "
                                              "change of the message."}


def _variables(props: dict[str, Any]) -> None:
    props["variables"].update({
        "maxProperties": 64, "propertyNames": {"pattern": VARIABLE_NAME_PATTERN},
        "additionalProperties": {"anyOf": [
            {"type": "string", "maxLength": 4096}, {"type": "number"}, {"type": "boolean"},
            {"type": "null"}]},
        "description": "Template variables: at most 64, strings up to 4,096 characters, "
                       "16 KiB in all (names and values as text; the deployment's "
                       "`max_variables_bytes` of JSON may be less: 422 "
                       "`variables_too_large`)."})


def channel_option_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a channel of a user send: the sender's form per channel."""
    schema["properties"]["sender"] = sender_property()
    senders = {"SMS": _or_null(SMS_SENDER), "EMAIL": _or_null(EMAIL)}
    _one_shape_per(schema, [
        {"channel": {"const": c}, "sender": senders.get(c, {"type": "null"})}
        for c in ("SMS", "EMAIL", "PUSH", "CHAT", "INAPP")])


def user_send_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a send request to a user: the variables' names and sizes,
    ``scheduled_at`` only for P2 and P3."""
    props = schema["properties"]
    _message_fields(props)
    props["channels"]["uniqueItems"] = True
    props["channels"]["description"] = ("The channels the message may go out on, the "
                                        "preferred first; a channel at most once.")
    schema["anyOf"] = [{"properties": {"tier": {"enum": ["P2", "P3"]}}},
                       {"properties": {"scheduled_at": {"type": "null"}}}]


def topic_send_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a send to a topic: its zone, the variables' names and sizes,
    P2 or P3, each channel once."""
    zoned(schema)
    props = schema["properties"]
    _variables(props)
    props["tier"] = {"enum": ["P2", "P3"], "default": "P3",
                     "description": "Topic sends are P2 or P3."}
    props["channels"]["uniqueItems"] = True
    props["channels"]["description"] = ("The channels each message may go out on, the "
                                        "preferred first; a channel at most once.")


def send_request_rules(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a send request: the recipient's form per channel (a phone
    number for SMS, an address for EMAIL, ``{device_token, platform}`` for PUSH),
    ``scheduled_at`` only for P2 and P3, and the variables' names and sizes."""
    props = schema["properties"]
    push = next(s for s in props["recipient"]["anyOf"] if "$ref" in s)
    props["recipient"] = {"description": "Per channel: an E.164 number (SMS), an email "
                                         "address (EMAIL), {device_token, platform} (PUSH), "
                                         "an incoming-webhook URL (CHAT), "
                                         "inapp:<user id> (INAPP).",
                          "anyOf": [{"type": "string"}, push]}
    _message_fields(props)
    props["sender"] = sender_property()
    schema["allOf"] = [
        {"oneOf": [
            {"properties": {"channel": {"const": "SMS"}, "recipient": PHONE,
                            "sender": _or_null(SMS_SENDER)}},
            {"properties": {"channel": {"const": "EMAIL"}, "recipient": EMAIL,
                            "sender": _or_null(EMAIL)}},
            {"properties": {"channel": {"const": "PUSH"}, "recipient": push,
                            "sender": {"type": "null"}}},
            {"properties": {"channel": {"const": "CHAT"}, "recipient": WEBHOOK_URL,
                            "sender": {"type": "null"}}},
            {"properties": {"channel": {"const": "INAPP"}, "recipient": INAPP,
                            "sender": {"type": "null"}}},
        ]},
        {"anyOf": [
            {"properties": {"tier": {"enum": ["P2", "P3"]}}},
            {"properties": {"scheduled_at": {"type": "null"}}},
        ]},
    ]
