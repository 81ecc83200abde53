"""Request ids from the client to the agent, against a real server started with
`--log-format json`: a sandbox created through the official SDK (which lets a caller add API
headers, so the create carries our `X-Request-Id`), then a command run over Connect with plain
HTTP (the SDK sends no custom headers to envd). For each: the answer carries the id, the
server's JSON log line for the request has it, and the agent's log line for the same operation
has it. Also: no id → a generated one; an oversized or malformed id → replaced, not echoed."""

from __future__ import annotations

import http.client as http_client
import json
import os
import re
import struct
import urllib.parse
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from bulkhead_testlib import TEMPLATE, BulkheadServer, http, wait_until

GENERATED = re.compile(r"^[0-9a-f]{16}$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def json_server():
    srv = BulkheadServer.start(extra_args=["--log-format", "json", "--pool-size", "0"])
    try:
        yield srv
    finally:
        srv.kill_all_sandboxes()
        srv.stop()
        srv.cleanup_files()


def server_lines(srv: BulkheadServer) -> list[dict]:
    out = []
    for line in srv.log_path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # the SDK-free startup banner lines, if any
    return out


def server_request_lines(srv: BulkheadServer, rid: str) -> list[dict]:
    return [l for l in server_lines(srv) if (l.get("span") or {}).get("request_id") == rid]


def agent_lines(srv: BulkheadServer, rid: str) -> list[str]:
    lines = []
    for log in Path(srv.data_dir).rglob("agent.log"):
        text = ANSI.sub("", log.read_text(errors="replace"))
        lines += [l for l in text.splitlines() if f"request_id={rid}" in l]
    return lines


def run_command(srv: BulkheadServer, sid: str, token: str, cmd: str, rid: str | None):
    """process.Process/Start over Connect (JSON codec, server streaming) through the proxy."""
    msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", cmd]}}).encode()
    body = struct.pack(">BI", 0, len(msg)) + msg
    headers = {
        "E2b-Sandbox-Id": sid,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": token,
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
    }
    if rid is not None:
        headers["X-Request-Id"] = rid
    u = urllib.parse.urlparse(srv.url)
    conn = http_client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/process.Process/Start", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("X-Request-Id"), data


@pytest.fixture(scope="module")
def sandbox(json_server):
    rid = f"create-{uuid.uuid4().hex}"
    sbx = Sandbox.create(
        TEMPLATE,
        timeout=120,
        api_key=json_server.api_key,
        api_url=json_server.url,
        sandbox_url=json_server.url,
        api_headers={"X-Request-Id": rid},
    )
    try:
        info = http("GET", f"{json_server.url}/sandboxes/{sbx.sandbox_id}", headers=json_server.api_headers())
        assert info.status == 200, info.body[:300]
        yield sbx, info.json()["envdAccessToken"], rid
    finally:
        sbx.kill()


def test_create_request_id_reaches_server_log_and_agent(json_server, sandbox):
    _, _, rid = sandbox
    lines = server_request_lines(json_server, rid)
    assert any(l["fields"].get("message") == "request answered" and l["fields"].get("status") == 201 for l in lines), lines
    # The engine's own /init call for this create carried the id into the agent's log.
    wait_until(lambda: agent_lines(json_server, rid), timeout=10)
    assert any("/init" in l for l in agent_lines(json_server, rid)), agent_lines(json_server, rid)


def test_command_request_id_end_to_end(json_server, sandbox):
    sbx, token, _ = sandbox
    rid = f"cmd-{uuid.uuid4().hex}"
    status, echoed, data = run_command(json_server, sbx.sandbox_id, token, "echo request-id-test", rid)
    assert status == 200, data[:300]
    assert b"request-id-test" in data or b"cmVxdWVzdC1pZC10ZXN0" in data  # stdout is base64 in JSON
    assert echoed == rid  # (a)
    lines = server_request_lines(json_server, rid)  # (b)
    assert any(l["fields"].get("message") == "request answered" for l in lines), lines
    assert all(l["span"]["path"] == "/process.Process/Start" for l in lines)
    wait_until(lambda: agent_lines(json_server, rid), timeout=10)  # (c)
    assert any("/process.Process/Start" in l for l in agent_lines(json_server, rid))


def test_generated_and_replaced_ids(json_server, sandbox):
    sbx, token, _ = sandbox
    status, generated, _ = run_command(json_server, sbx.sandbox_id, token, "true", None)
    assert status == 200
    assert GENERATED.match(generated or ""), generated
    assert server_request_lines(json_server, generated)
    wait_until(lambda: agent_lines(json_server, generated), timeout=10)
    for bad in ["x" * 200, "bad id with spaces", "a/b\\c"]:
        status, echoed, _ = run_command(json_server, sbx.sandbox_id, token, "true", bad)
        assert status == 200
        assert echoed != bad and GENERATED.match(echoed or ""), echoed
        assert not agent_lines(json_server, bad)
    # Control-plane answers carry ids too, errors included, and 5xx messages name the same id.
    r = http("GET", f"{json_server.url}/sandboxes/nope", headers={**json_server.api_headers(), "X-Request-Id": "probe-1"})
    assert r.status == 404
    assert r.header("X-Request-Id") == "probe-1"
