"""The served OpenAPI document: valid OpenAPI 3.1, and every route states its security, its
errors (with the one error body) and the headers those errors carry."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate

from notiflow.gateway.app import build_app
from notiflow.settings import Settings
from tests.helpers import dev_environ

ERROR_REF = "#/components/schemas/ErrorBody"
WEBHOOK_SCHEMES = {"/webhooks/twilio": "TwilioSignature",
                   "/webhooks/twilio/inbound": "TwilioSignature",
                   "/webhooks/sendgrid": "SendGridSignature",
                   "/webhooks/vonage": "VonageSignature",
                   "/webhooks/vonage/inbound": "VonageSignature",
                   "/webhooks/smtp-dsn": "DsnWebhookSecret",
                   "/webhooks/unsubscribe-mail": "DsnWebhookSecret",
                   "/webhooks/ses": "SnsSignature"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    with dev_environ():
        return build_app(Settings()).openapi()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in doc["paths"].items()
            for method, op in ops.items()]


def test_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_tenant_route_needs_the_token_and_lists_401_and_503(doc: dict[str, Any]) -> None:
    tenant = [(p, m, op) for p, m, op in operations(doc) if p.startswith("/v1/")]
    assert len(tenant) >= 24
    for path, method, op in tenant:
        assert op.get("security") == [{"TenantToken": []}], (method, path)
        assert "401" in op["responses"], (method, path)
        assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
        if path != "/v1/messages:batch":
            assert "503" in op["responses"], (method, path)


def test_webhooks_authenticate_by_provider_signature(doc: dict[str, Any]) -> None:
    for path, method, op in operations(doc):
        if path.startswith("/webhooks/"):
            assert op["security"] == [{WEBHOOK_SCHEMES[path]: []}], (method, path)
            assert {"403", "503"} <= set(op["responses"]), (method, path)
    assert set(doc["components"]["securitySchemes"]) == {"TenantToken", *WEBHOOK_SCHEMES.values()}


PAGE = "/preferences/{token}"
"""The hosted page: a person's browser, so an unknown link is a ``404`` page and a save it
cannot take a ``422`` page, not JSON."""


def test_every_error_uses_the_error_body_and_retry_after_where_due(doc: dict[str, Any]) -> None:
    for path, method, op in operations(doc):
        for code, answer in op["responses"].items():
            if int(code) < 400:
                continue
            if path == PAGE and (code == "404" or (method, code) == ("post", "422")):
                assert set(answer["content"]) == {"text/html"}, method
                continue
            schema = answer["content"]["application/json"]["schema"]
            assert schema == {"$ref": ERROR_REF}, (method, path, code)
            if code in ("429", "503"):
                assert answer["headers"]["Retry-After"]["required"] is True, (method, path)
    assert "HTTPValidationError" not in doc["components"]["schemas"]


def test_success_answers_have_models_and_links(doc: dict[str, Any]) -> None:
    send = doc["paths"]["/v1/messages"]["post"]
    accepted = send["responses"]["202"]
    assert accepted["content"]["application/json"]["schema"]["anyOf"] == [
        {"$ref": "#/components/schemas/Accepted"},
        {"$ref": "#/components/schemas/UserAccepted"}]
    assert accepted["headers"]["Location"]["required"] is True
    assert accepted["links"]["GetMessage"]["operationId"] == "get_message"
    assert "Idempotency-Key" in {p["name"] for p in send["parameters"]}
    assert send["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessageRequest"}
    assert doc["components"]["schemas"]["MessageRequest"]["anyOf"] == [
        {"$ref": "#/components/schemas/SendRequest"},
        {"$ref": "#/components/schemas/UserSendRequest"}]
    batch = doc["paths"]["/v1/messages:batch"]["post"]["responses"]["200"]
    assert batch["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BatchResults"}
    for path, method, op in operations(doc):
        ok = [c for c in op["responses"] if c.startswith("2")]
        assert ok or (path, method) == (PAGE, "post"), (method, path)
        for code in ok:
            media = ("text/html" if path.startswith("/unsubscribe/") or path == PAGE
                     else "application/xml" if path == "/webhooks/twilio/inbound"
                     else "application/json")
            if code not in ("204", "303") and path != "/webhooks/twilio":
                assert "schema" in op["responses"][code]["content"][media], (
                    method, path, code)


def test_every_referenced_schema_exists(doc: dict[str, Any]) -> None:
    names = set(doc["components"]["schemas"])

    def refs(node: Any) -> set[str]:
        if isinstance(node, dict):
            own = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
            return own.union(*(refs(v) for v in node.values()))
        if isinstance(node, list):
            return set().union(*(refs(v) for v in node))
        return set()

    assert {r.rsplit("/", 1)[-1] for r in refs(doc)} <= names
