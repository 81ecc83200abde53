"""The wire contract the SDKs depend on, checked with raw HTTP (no SDK): status codes, field
names, error shape, auth, both create/connect generations, routing by header."""

from __future__ import annotations

import http.client as http_client
import json
import re
import urllib.parse
import uuid

import pytest

from bulkhead_testlib import TEMPLATE, generate_api_key, http

ID_RE = re.compile(r"^[a-z0-9]+$")
SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+")


@pytest.fixture
def api(server):
    made = []

    class Api:
        url = server.url
        headers = server.api_headers()

        def call(self, method, path, body=None, headers=None, **kw):
            h = dict(self.headers)
            h.update(headers or {})
            return http(method, self.url + path, body, headers=h, **kw)

        def create(self, path="/v2/sandboxes", body=None):
            b = {"templateID": TEMPLATE, "timeout": 120, "metadata": {"bulkhead-test": "wire"}}
            b.update(body or {})
            r = self.call("POST", path, b)
            if r.status == 201:
                made.append(r.json()["sandboxID"])
            return r

    yield Api()
    for sid in made:
        http("DELETE", f"{server.url}/sandboxes/{sid}", headers=server.api_headers())


def _assert_error_shape(r, status):
    assert r.status == status, (r.status, r.body[:300])
    body = r.json()
    assert body["code"] == status
    assert isinstance(body["message"], str) and body["message"]


def _assert_sandbox_shape(s):
    assert ID_RE.match(s["sandboxID"]), s
    assert isinstance(s["templateID"], str) and s["templateID"]
    assert isinstance(s["clientID"], str)
    assert SEMVER_RE.match(s["envdVersion"])
    assert isinstance(s.get("envdAccessToken"), str) and s["envdAccessToken"]


def test_health_needs_no_key(server):
    r = http("GET", server.url + "/health")
    assert r.status == 204
    assert r.body == b""


def test_auth_required_and_checked(server):
    r = http("POST", server.url + "/v2/sandboxes", {"templateID": TEMPLATE})
    _assert_error_shape(r, 401)
    r = http("POST", server.url + "/v2/sandboxes", {"templateID": TEMPLATE}, headers={"X-API-Key": generate_api_key()})
    _assert_error_shape(r, 401)
    r = http("GET", server.url + "/v2/sandboxes", headers={"X-API-Key": "garbage"})
    _assert_error_shape(r, 401)
    # Header names are case-insensitive (the SDKs send X-API-KEY).
    r = http("GET", server.url + "/v2/sandboxes", headers={"x-api-key": server.api_key})
    assert r.status == 200


def test_create_v2_minimal_bodies(api):
    # What the SDKs really send: Python {"templateID", "metadata": {}, "envVars": {}}, JS {"templateID"}.
    for body in ({"templateID": TEMPLATE, "metadata": {}, "envVars": {}}, {"templateID": TEMPLATE}):
        r = api.call("POST", "/v2/sandboxes", body)
        assert r.status == 201, r.body[:500]
        s = r.json()
        _assert_sandbox_shape(s)
        api.call("DELETE", f"/sandboxes/{s['sandboxID']}")


def test_create_v2_and_get_detail(api):
    r = api.create(body={"metadata": {"k": "v", "bulkhead-test": "wire"}, "envVars": {"X": "1"}, "timeout": 90})
    assert r.status == 201, r.body[:500]
    s = r.json()
    _assert_sandbox_shape(s)
    d = api.call("GET", f"/sandboxes/{s['sandboxID']}")
    assert d.status == 200
    d = d.json()
    for f in ("templateID", "sandboxID", "clientID", "startedAt", "endAt", "envdVersion", "cpuCount", "memoryMB", "diskSizeMB", "state"):
        assert f in d, f
    assert d["state"] == "running"
    assert d["metadata"] == {"k": "v", "bulkhead-test": "wire"}
    assert isinstance(d["cpuCount"], int) and isinstance(d["memoryMB"], int) and isinstance(d["diskSizeMB"], int)


def test_create_legacy_v1(api):
    # Older SDKs (<= 2.45): POST /sandboxes with `secure: true` and an explicit timeout.
    r = api.create("/sandboxes", {"secure": True, "timeout": 60, "allow_internet_access": True, "metadata": {}, "envVars": {}})
    assert r.status == 201, r.body[:500]
    _assert_sandbox_shape(r.json())


def test_create_errors(api):
    r = api.call("POST", "/v2/sandboxes", {"templateID": "no-such-template-xyz"})
    assert r.status in (400, 404), r.body[:300]
    _assert_error_shape(r, r.status)
    r = api.call("POST", "/v2/sandboxes", b"{not json", headers={"Content-Type": "application/json"})
    assert 400 <= r.status < 500


def test_create_accepts_chunked_body(server):
    # The JS SDK sends control-plane bodies with Transfer-Encoding: chunked.
    body = json.dumps({"templateID": TEMPLATE, "timeout": 60, "metadata": {"bulkhead-test": "wire"}}).encode()
    host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
    conn = http_client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", "/v2/sandboxes")
    conn.putheader("X-API-Key", server.api_key)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (body[:10], body[10:]):
        conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 201, data[:300]
    sid = json.loads(data)["sandboxID"]
    http("DELETE", f"{server.url}/sandboxes/{sid}", headers=server.api_headers())


def test_list_v1_and_v2(api):
    tag = "wire-list-" + uuid.uuid4().hex[:10]
    sids = [api.create(body={"metadata": {"bulkhead-test": "wire", "grp": tag, "n": str(i)}}).json()["sandboxID"] for i in range(3)]
    q = urllib.parse.urlencode({"metadata": urllib.parse.urlencode({"grp": tag})})
    r = api.call("GET", f"/v2/sandboxes?{q}&state=running,paused&limit=2")
    assert r.status == 200
    page1 = r.json()
    assert len(page1) == 2
    token = r.header("x-next-token")
    assert token
    r2 = api.call("GET", f"/v2/sandboxes?{q}&limit=2&nextToken={urllib.parse.quote(token)}")
    assert r2.status == 200
    page2 = r2.json()
    assert len(page2) == 1
    assert not r2.header("x-next-token")
    assert {s["sandboxID"] for s in page1 + page2} == set(sids)
    for s in page1 + page2:
        for f in ("templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion"):
            assert f in s, f
    # v1 list (deprecated, CLI) returns running sandboxes, with its own metadata filter.
    r = api.call("GET", f"/sandboxes?{q}")
    assert r.status == 200
    assert set(sids) <= {s["sandboxID"] for s in r.json()}


def test_timeout_connect_kill_statuses(api):
    sid = api.create(body={"timeout": 60}).json()["sandboxID"]
    assert api.call("POST", f"/sandboxes/{sid}/timeout", {"timeout": 120}).status == 204
    end1 = api.call("GET", f"/sandboxes/{sid}").json()["endAt"]
    r = api.call("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 10})
    assert r.status == 200, r.body[:300]  # 200 = already running (201 only when resumed)
    _assert_sandbox_shape(r.json())
    assert api.call("GET", f"/sandboxes/{sid}").json()["endAt"] >= end1  # never shortened
    r = api.call("POST", f"/sandboxes/{sid}/connect", {"timeout": 300})  # legacy connect
    assert r.status in (200, 201), r.body[:300]
    _assert_sandbox_shape(r.json())
    assert api.call("GET", f"/sandboxes/{sid}").json()["endAt"] > end1

    assert api.call("DELETE", f"/sandboxes/{sid}").status == 204
    _assert_error_shape(api.call("DELETE", f"/sandboxes/{sid}"), 404)
    _assert_error_shape(api.call("GET", f"/sandboxes/{sid}"), 404)
    _assert_error_shape(api.call("POST", f"/sandboxes/{sid}/timeout", {"timeout": 30}), 404)
    _assert_error_shape(api.call("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 30}), 404)


def test_metrics_endpoint(api):
    sid = api.create().json()["sandboxID"]
    r = api.call("GET", f"/sandboxes/{sid}/metrics")
    assert r.status == 200
    assert isinstance(r.json(), list)
    for m in r.json():
        for f in ("timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "diskUsed", "diskTotal"):
            assert f in m, f


def test_data_plane_routing_and_token(api, server):
    s = api.create().json()
    sid, token = s["sandboxID"], s["envdAccessToken"]
    route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
    # envd health through the router.
    assert http("GET", server.url + "/health", headers=route).status == 204
    # Connect unary call, JSON codec; needs the access token.
    rpc_headers = {**route, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    r = http("POST", server.url + "/process.Process/List", b"{}", headers=rpc_headers)
    assert r.status == 401, (r.status, r.body[:200])
    r = http("POST", server.url + "/process.Process/List", b"{}", headers={**rpc_headers, "X-Access-Token": token})
    assert r.status == 200, (r.status, r.body[:200])
    assert "processes" in r.json() or r.json() == {}
    # Not found error from envd has the Connect error shape.
    r = http(
        "POST",
        server.url + "/filesystem.Filesystem/Stat",
        json.dumps({"path": "/nope/nope"}).encode(),
        headers={**rpc_headers, "X-Access-Token": token},
    )
    assert r.status == 404
    assert r.json()["code"] == "not_found"
    # An unknown sandbox: 502 with the message the SDKs match ("was not found").
    r = http("GET", server.url + "/health", headers={"E2b-Sandbox-Id": "nosuchsandbox000", "E2b-Sandbox-Port": "49983"})
    assert r.status == 502
    assert "was not found" in r.body.decode()
    # A killed sandbox behaves the same.
    api.call("DELETE", f"/sandboxes/{sid}")
    r = http("GET", server.url + "/health", headers=route)
    assert r.status == 502 and "was not found" in r.body.decode()
