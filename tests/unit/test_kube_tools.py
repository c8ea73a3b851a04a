"""The schema rewrites behind the chart's offline validation (ops/kube_tools.py)."""

from __future__ import annotations

import jsonschema

from notiflow.ops.kube_tools import standalone, strict

DEFS = {
    "Pod": {"type": "object", "properties": {
        "spec": {"$ref": "#/$defs/PodSpec"}, "kind": {"type": "string"}},
        "additionalProperties": False},
    "PodSpec": {"type": "object", "properties": {
        "containers": {"type": "array", "items": {"$ref": "#/$defs/Container"}},
        "owner": {"$ref": "#/$defs/Pod"}}, "additionalProperties": False},
    "Container": {"type": "object", "properties": {"name": {"type": "string"}},
                  "additionalProperties": False},
    "Unrelated": {"type": "string"},
}


def test_a_schema_carries_every_definition_it_reaches_and_no_other() -> None:
    top = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "$ref": "/api/_definitions.json#/$defs/Pod"}
    out = standalone(top, DEFS)
    assert set(out["$defs"]) == {"Pod", "PodSpec", "Container"}
    assert out["$ref"] == "#/$defs/Pod"
    validator = jsonschema.Draft202012Validator(out)
    assert validator.is_valid({"kind": "Pod", "spec": {"containers": [{"name": "a"}]}})
    assert not validator.is_valid({"spec": {"containers": [{"name": "a", "bogus": 1}]}})


def test_a_crd_schema_becomes_strict() -> None:
    crd = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "replicas": {"type": "integer"},
            "port": {"x-kubernetes-int-or-string": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {"a": {"type": "string"}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}}
    v = jsonschema.Draft202012Validator(strict(crd))
    assert v.is_valid({"spec": {"replicas": 1, "port": "http", "free": {"b": 1},
                                "labels": {"x": "y"}}})
    assert v.is_valid({"spec": {"port": 8080}})
    assert not v.is_valid({"spec": {"replicaz": 1}})
    assert not v.is_valid({"extra": 1})
    assert not v.is_valid({"spec": {"port": 1.5}})
