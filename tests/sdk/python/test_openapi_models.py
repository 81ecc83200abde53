"""docs/openapi.json against the official Python SDK's generated models (no server needed).

For every schema of ours that has an SDK model of the same name: each property we declare is a
field the SDK knows (bar the Bulkhead extensions listed below), every field the SDK requires of
a response we produce is a required property of ours, and an object built from our schema
(each property filled according to its declared type and format) is accepted by the SDK's own
`from_dict` and survives its `to_dict` with the same keys."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

DOC = json.loads((Path(__file__).resolve().parents[3] / "docs" / "openapi.json").read_text())
SCHEMAS = DOC["components"]["schemas"]
MODELS = importlib.import_module("e2b.api.client.models")

# Fields Bulkhead accepts or returns beyond E2B's models (documented in the schema).
EXTENSIONS = {
    "NewSandbox": {"lifecycle"},  # also accepts the lifecycle as one object
    "SandboxDetail": set(),
    "Template": set(),
}
# Fields the SDK's model requires that Bulkhead does not send, with why. The SDKs never parse
# these answers (GET /templates is only called by E2B's CLI), so they fail nothing today.
KNOWN_GAPS = {
    # Bulkhead's template registry keeps no creation times, authors or usage counters.
    "Template": {"createdAt", "updatedAt", "createdBy", "lastSpawnedAt", "spawnCount", "buildCount", "envdVersion"},
}
# Our schemas that are E2B models under the same name. Request bodies are checked for names
# and types only (we may accept more, or accept optional what the SDK always sends).
RESPONSES = {
    "Sandbox", "SandboxDetail", "Secret", "SnapshotInfo", "SandboxMetric", "SandboxesWithMetrics",
    "SandboxForkResult", "Template", "TemplateRequestResponseV3", "TemplateBuildFileUpload",
    "TemplateBuildInfo", "BuildLogEntry", "BuildStatusReason", "TemplateAliasResponse",
    "AssignedTemplateTags", "TemplateTag", "Volume", "VolumeAndToken", "SandboxLifecycle",
    "SandboxNetworkConfig", "SandboxVolumeMount", "Error",
}
REQUESTS = {
    "NewSandbox", "NewSecret", "SecretUpdate", "ConnectSandbox", "SandboxPauseRequest",
    "ResumedSandbox", "SandboxSnapshotRequest", "SandboxForkRequest", "SandboxTimeoutRequest",
    "SandboxRefreshRequest", "SandboxNetworkUpdateConfig", "SandboxAutoResumeConfig",
    "NewVolume", "TemplateBuildRequestV3", "TemplateBuildStartV2", "TemplateStep",
    "AssignTemplateTagsRequest", "DeleteTemplateTagsRequest",
}


def sdk_model(name):
    return getattr(MODELS, name, None)


def sdk_fields(model) -> tuple[set[str], set[str]]:
    """(all wire keys, required wire keys) read from the model's generated `from_dict`."""
    src = Path(importlib.import_module(model.__module__).__file__).read_text()
    every = set(re.findall(r'd\.pop\("([^"]+)"', src))
    required = set(re.findall(r'd\.pop\("([^"]+)"\)', src))
    return every, required


def resolve(s):
    if "$ref" in s:
        return SCHEMAS[s["$ref"].rsplit("/", 1)[1]]
    for key in ("oneOf", "anyOf"):
        if key in s:
            non_null = [x for x in s[key] if x.get("type") != "null"]
            return resolve(non_null[0])
    return s


def sample(s, depth=0):
    """A value of schema `s` as a client would receive it."""
    s = resolve(s)
    if "example" in s:
        return s["example"]
    if "enum" in s:
        return s["enum"][0]
    t = s.get("type")
    if isinstance(t, list):
        t = next(x for x in t if x != "null")
    if t == "string":
        formats = {"date-time": "2026-11-24T10:00:00.000Z", "binary": "", "uuid": "123e4567-e89b-12d3-a456-426614174000"}
        return formats.get(s.get("format"), "running")
    if t == "integer":
        return 1
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        return [sample(s["items"], depth + 1)] if depth < 4 else []
    if t == "object" or "properties" in s:
        if "additionalProperties" in s and isinstance(s["additionalProperties"], dict):
            return {"k": sample(s["additionalProperties"], depth + 1)}
        return {k: sample(v, depth + 1) for k, v in s.get("properties", {}).items()} if depth < 4 else {}
    return "x"


@pytest.mark.parametrize("name", sorted(RESPONSES | REQUESTS))
def test_schema_agrees_with_sdk_model(name):
    assert name in SCHEMAS, f"{name} is not in docs/openapi.json"
    model = sdk_model(name)
    assert model is not None, f"the SDK has no model {name}"
    ours = SCHEMAS[name]
    props = set(ours.get("properties", {}))
    every, required = sdk_fields(model)
    unknown = props - every - EXTENSIONS.get(name, set())
    assert not unknown, f"{name}: properties the SDK's model does not have: {sorted(unknown)}"
    if name in RESPONSES:
        missing = required - set(ours.get("required", [])) - KNOWN_GAPS.get(name, set())
        assert not missing, f"{name}: the SDK requires {sorted(missing)}, which we do not always send"
    obj = sample(ours)
    for gap in KNOWN_GAPS.get(name, ()):
        obj[gap] = None if gap in ("createdBy", "lastSpawnedAt") else sample({"type": "integer"}) if gap.endswith("Count") else sample({"type": "string", "format": "date-time"}) if gap.endswith("At") else "0.5.0"
    parsed = model.from_dict(dict(obj))
    back = parsed.to_dict()
    assert set(back) == set(obj), f"{name}: SDK round trip changed the keys: {set(back) ^ set(obj)}"
