"""The MCP server, driven by the official MCP Python SDK (PyPI `mcp`) against a real `bulkhead serve`:
Streamable HTTP at `/mcp` (the SDK's default "auto" connect: it probes the 2026-07-28 discover
lifecycle and falls back to the `initialize` handshake Bulkhead speaks, since sessions carry the
sandbox) and `bulkhead mcp --stdio` through the SDK's stdio transport.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import egresslab
from bulkhead_testlib import REPO, http, wait_until

TOOLS = {
    "create_sandbox",
    "run_code",
    "create_code_context",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "file_url",
    "list_sandboxes",
    "pause_sandbox",
    "resume_sandbox",
    "kill_sandbox",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(fn, *args):
    return anyio.run(fn, *args)


def http_client(server, headers=None):
    transport = streamable_http_client(
        f"{server.url}/mcp",
        http_client=create_mcp_http_client(headers={"X-API-Key": server.api_key} if headers is None else headers),
    )
    return Client(transport, read_timeout_seconds=300)


def stdio_client(server):
    binary = os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))
    params = StdioServerParameters(
        command=binary,
        args=["mcp", "--stdio"],
        env={"E2B_API_URL": server.url, "E2B_API_KEY": server.api_key, "NO_PROXY": "127.0.0.1,localhost"},
    )
    return Client(params, read_timeout_seconds=300)


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def data_of(result) -> dict:
    assert not result.is_error, text_of(result)
    return json.loads(result.content[0].text)


def sandbox_ids(server) -> set:
    r = http("GET", f"{server.url}/v2/sandboxes?limit=100", headers=server.api_headers())
    assert r.status == 200, r.body
    return {s["sandboxID"] for s in r.json()}


def session_sandbox(server, before: set) -> str:
    new = sandbox_ids(server) - before
    assert len(new) == 1, f"expected one sandbox for the session, got {new}"
    return new.pop()


# ---- discovery --------------------------------------------------------------------------------


def test_lists_tools_with_schemas(server):
    async def main():
        async with http_client(server) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in run(main)}
    assert set(tools) == TOOLS
    code = tools["run_code"].input_schema
    assert code["type"] == "object" and code["required"] == ["code"], code
    # The field docs reach the schema: that is what the model reads.
    assert "persist" in code["properties"]["code"]["description"], code
    net = tools["create_sandbox"].input_schema["properties"]
    assert "allowed_domains" in net and net["allowed_domains"]["description"], net
    assert tools["file_url"].input_schema["properties"]["operation"], tools["file_url"].input_schema


# ---- code, state, charts ------------------------------------------------------------------------


def test_state_persists_across_calls_and_session_end_kills_the_sandbox(server):
    before = sandbox_ids(server)

    async def main():
        async with http_client(server) as c:
            first = data_of(await c.call_tool("run_code", {"code": "x = 41\nprint('set')"}))
            sid = session_sandbox(server, before)
            second = data_of(await c.call_tool("run_code", {"code": "x + 1"}))
            listed = data_of(await c.call_tool("list_sandboxes", {}))
            # A second context does not see the default context's variables.
            ctx = data_of(await c.call_tool("create_code_context", {"language": "python"}))
            other = data_of(await c.call_tool("run_code", {"code": "'x' in globals()", "context_id": ctx["context_id"]}))
            err = data_of(await c.call_tool("run_code", {"code": "1/0"}))
            return first, second, listed, other, err, sid

    first, second, listed, other, err, sid = run(main)
    assert first["stdout"] == "set\n", first
    assert second["results"][0]["text"] == "42", second
    assert second["results"][0].get("is_main_result") is True, second
    defaults = [s for s in listed["sandboxes"] if s["session_default"]]
    assert [s["sandbox_id"] for s in defaults] == [sid], listed
    assert other["results"][0]["text"] == "False", other
    assert err["error"]["name"] == "ZeroDivisionError", err
    # The client closed its session (DELETE /mcp): the session's sandbox is killed.
    assert wait_until(lambda: sid not in sandbox_ids(server), timeout=30), f"session sandbox {sid} outlived its session"


def test_chart_comes_back_as_png_image_content(server):
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('squares')\n"
        "plt.show()\n"
    )

    async def main():
        async with http_client(server) as c:
            return await c.call_tool("run_code", {"code": code})

    result = run(main)
    assert not result.is_error, text_of(result)
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1, result.content
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    summary = json.loads(result.content[0].text)
    chart = summary["results"][0]["chart"]
    assert chart["type"] == "line" and chart["title"] == "squares", chart
    assert summary["results"][0]["other_formats"] == ["png"], summary


# ---- commands, files, URLs ----------------------------------------------------------------------


def test_commands_files_and_signed_urls(server):
    async def main():
        async with http_client(server) as c:
            out = data_of(await c.call_tool("run_command", {"command": "echo out; echo err >&2; exit 3"}))
            slow = await c.call_tool("run_command", {"command": "sleep 30", "timeout_seconds": 1})
            wrote = data_of(await c.call_tool("write_file", {"path": "/tmp/mcp/dir/note.txt", "content": "hello from mcp\n"}))
            read = await c.call_tool("read_file", {"path": "/tmp/mcp/dir/note.txt"})
            listing = data_of(await c.call_tool("list_files", {"path": "/tmp/mcp", "depth": 2}))
            down = data_of(await c.call_tool("file_url", {"path": "/tmp/mcp/dir/note.txt", "operation": "download"}))
            up = data_of(await c.call_tool("file_url", {"path": "/tmp/mcp/up.bin", "operation": "upload"}))
            await anyio.to_thread.run_sync(_use_urls, down["url"], up["url"])
            check = data_of(await c.call_tool("run_command", {"command": "od -An -tx1 /tmp/mcp/up.bin"}))
            return out, slow, wrote, read, listing, check

    out, slow, wrote, read, listing, check = run(main)
    assert out == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n", "error": out.get("error")}, out
    slow_out = data_of(slow)
    assert slow_out["exit_code"] != 0, slow_out
    assert wrote["bytes_written"] == 15
    assert text_of(read) == "hello from mcp\n"
    paths = {e["path"]: e["type"] for e in listing["entries"]}
    assert paths == {"/tmp/mcp/dir": "dir", "/tmp/mcp/dir/note.txt": "file"}, listing
    assert check["stdout"].split() == ["00", "ff", "10"], check


def _use_urls(download: str, upload: str):
    assert "signature=" in download and "signature_expiration=" in download, download
    with urllib.request.urlopen(download, timeout=30) as r:
        assert r.read() == b"hello from mcp\n"
    req = urllib.request.Request(upload, data=b"\x00\xff\x10", method="POST", headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    # A tampered URL is refused.
    bad = download.replace("note.txt", "other.txt")
    try:
        urllib.request.urlopen(bad, timeout=30)
        raise AssertionError("a URL with a changed path must be refused")
    except urllib.error.HTTPError as e:
        assert e.code == 401, e


# ---- network policy -----------------------------------------------------------------------------


def test_network_policy_is_enforced(server, lab):
    async def main():
        async with http_client(server) as c:
            made = data_of(
                await c.call_tool(
                    "create_sandbox",
                    {"allow_internet": False, "allowed_domains": ["api.allowed.test"], "timeout_seconds": 300},
                )
            )
            ok = data_of(await c.call_tool("run_command", {"command": "curl -sS -m 10 http://api.allowed.test/from-mcp"}))
            denied = data_of(await c.call_tool("run_command", {"command": "curl -sS -m 5 http://denied.test/"}))
            by_ip = data_of(await c.call_tool("run_command", {"command": f"curl -sS -m 5 http://{egresslab.UPSTREAM_IP}/"}))
            code = data_of(
                await c.call_tool(
                    "run_code",
                    {"code": "import urllib.request\nurllib.request.urlopen('http://denied.test/', timeout=5).status"},
                )
            )
            return made, ok, denied, by_ip, code

    made, ok, denied, by_ip, code = run(main)
    assert made["session_default"] is True and made["allow_internet"] is False, made
    assert made["network"]["allowOut"] == ["api.allowed.test"], made
    assert ok["exit_code"] == 0, ok
    assert json.loads(ok["stdout"])["path"] == "/from-mcp", ok
    assert denied["exit_code"] != 0, denied
    assert by_ip["exit_code"] != 0, by_ip
    assert code["error"] is not None, code
    assert "/from-mcp" in [r["path"] for r in lab.requests()]


# ---- errors and auth ----------------------------------------------------------------------------


def test_bad_input_is_a_tool_error(server):
    async def main():
        async with http_client(server) as c:
            return [
                await c.call_tool("run_code", {}),
                await c.call_tool("run_code", {"code": "1", "language": "python", "context_id": "abc"}),
                await c.call_tool("run_code", {"code": "1", "unknown": True}),
                await c.call_tool("run_command", {"command": "true", "sandbox_id": "doesnotexist"}),
                await c.call_tool("read_file", {"path": "/no/such/file"}),
                await c.call_tool("list_files", {"depth": 0}),
                await c.call_tool("create_sandbox", {"template": "no-such-template"}),
                await c.call_tool("run_code", {"code": "1", "context_id": "no-such-context"}),
            ]

    results = run(main)
    expected = [
        "missing field `code`",
        "either language or context_id",
        "unknown field `unknown`",
        "doesnotexist not found",
        "reading the file failed",
        "depth must be from 1 to 10",
        "'no-such-template' not found",
        "Context no-such-context not found",
    ]
    for result, want in zip(results, expected):
        assert result.is_error, text_of(result)
        assert want in text_of(result), (want, text_of(result))


def test_requests_without_a_valid_key_are_refused(server):
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    for extra in ({}, {"X-API-Key": "e2b_wrong"}, {"Authorization": "Bearer e2b_wrong"}):
        r = http("POST", f"{server.url}/mcp", body, headers={**headers, **extra})
        assert r.status == 401, (extra, r.status, r.body)
    ok = http("POST", f"{server.url}/mcp", body, headers={**headers, "Authorization": f"Bearer {server.api_key}"})
    assert ok.status == 200, ok.body
    sid = ok.header("mcp-session-id")
    assert sid, ok.headers
    http("DELETE", f"{server.url}/mcp", headers={"Mcp-Session-Id": sid, "X-API-Key": server.api_key})

    async def main():
        async with http_client(server, headers={}) as c:
            await c.list_tools()

    with pytest.raises(BaseException):
        run(main)


# ---- pause / resume -----------------------------------------------------------------------------


def test_pause_and_resume_keep_kernel_state(server):
    async def main():
        async with http_client(server) as c:
            data_of(await c.call_tool("run_code", {"code": "kept = 'still here'"}))
            paused = data_of(await c.call_tool("pause_sandbox", {}))
            listed = data_of(await c.call_tool("list_sandboxes", {}))
            resumed = data_of(await c.call_tool("resume_sandbox", {}))
            after = data_of(await c.call_tool("run_code", {"code": "kept"}))
            killed = data_of(await c.call_tool("kill_sandbox", {}))
            return paused, listed, resumed, after, killed

    paused, listed, resumed, after, killed = run(main)
    states = {s["sandbox_id"]: s["state"] for s in listed["sandboxes"]}
    assert states[paused["sandbox_id"]] == "paused", listed
    assert resumed["resumed"] is True and resumed["state"] == "running", resumed
    assert after["results"][0]["text"] == "still here", after
    assert killed == {"sandbox_id": paused["sandbox_id"], "killed": True}
    assert paused["sandbox_id"] not in sandbox_ids(server)


# ---- stdio --------------------------------------------------------------------------------------


def test_stdio_bridge(server):
    before = sandbox_ids(server)

    async def main():
        async with stdio_client(server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            data_of(await c.call_tool("run_code", {"code": "y = 6 * 7"}))
            sid = session_sandbox(server, before)
            got = data_of(await c.call_tool("run_code", {"code": "y"}))
            bad = await c.call_tool("run_code", {"language": "python"})
            return names, got, bad, sid

    names, got, bad, sid = run(main)
    assert names == TOOLS
    assert got["results"][0]["text"] == "42", got
    assert bad.is_error and "missing field `code`" in text_of(bad)
    # The client ended the command: its upstream session closed and the sandbox was killed.
    assert wait_until(lambda: sid not in sandbox_ids(server), timeout=30), f"session sandbox {sid} outlived its session"


def test_stdio_without_a_server_fails_clearly(tmp_path: Path):
    import subprocess

    binary = os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))
    env = {**os.environ, "E2B_API_URL": "http://127.0.0.1:9", "E2B_API_KEY": "e2b_x"}
    init = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
    )
    p = subprocess.run([binary, "mcp", "--stdio"], input=init + "\n", env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "is `bulkhead serve` running" in p.stderr, p.stderr


def test_request_id_reaches_the_agent(server):
    """A tool call's HTTP request carries the client's `X-Request-Id`; the agent calls the tool
    makes carry it too, so the agent's log names it (rmcp runs tools in the session's task, where
    `call_tool` re-enters the request's id)."""
    import re
    import uuid

    rid = f"mcp-{uuid.uuid4().hex}"
    ansi = re.compile(r"\x1b\[[0-9;]*m")

    def agent_lines():
        lines = []
        for log in Path(server.data_dir).rglob("agent.log"):
            text = ansi.sub("", log.read_text(errors="replace"))
            lines += [l for l in text.splitlines() if f"request_id={rid}" in l]
        return lines

    async def main():
        headers = {"X-API-Key": server.api_key, "X-Request-Id": rid}
        async with http_client(server, headers=headers) as c:
            out = data_of(await c.call_tool("run_command", {"command": "echo traced"}))
            # Read the agent's log while the session's sandbox (and its slot) still exists.
            lines = await anyio.to_thread.run_sync(lambda: wait_until(agent_lines, timeout=10))
            return out, lines

    out, lines = run(main)
    assert out["stdout"] == "traced\n", out
    assert any("/process.Process/Start" in l for l in lines), lines
    assert rid in server.log_since(0, max_lines=100000), "the server's own lines name the id"


# ---- tenancy (issue 22 row 8) -------------------------------------------------------------------


def _rpc(server, key, sid, method, params=None, rid=1):
    """One JSON-RPC request on `/mcp` in session `sid`; (status, the JSON-RPC answer or None)."""
    body = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if rid is not None:
        body["id"] = rid
    headers = {"Accept": "application/json, text/event-stream", "X-API-Key": key, "Mcp-Protocol-Version": "2025-06-18"}
    if sid:
        headers["Mcp-Session-Id"] = sid
    r = http("POST", f"{server.url}/mcp", body, headers=headers, timeout=300)
    answer = None
    for line in r.body.decode(errors="replace").splitlines():
        if line.startswith("data:") and line[5:].strip():
            answer = json.loads(line[5:])
    if answer is None and r.body.strip().startswith(b"{"):
        answer = json.loads(r.body)
    return r, answer


def test_a_session_id_works_only_with_the_key_that_opened_it(server):
    """Another team's key with a live session's `Mcp-Session-Id` gets what an unknown id gets
    (404): it cannot run commands in the session's sandbox, read its files or end it."""
    if not server.owned:
        pytest.skip("SKIPPED: needs the suite's own server (team B is made with the CLI on its data dir)")
    import subprocess
    import uuid

    binary = os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))

    def cli(*args):
        r = subprocess.run([binary, *args, "--data-dir", str(server.data_dir)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    team = f"mcp-b-{uuid.uuid4().hex[:8]}"
    cli("teams", "create", team)
    key_b = cli("keys", "create", "--team", team, "--name", f"{team}-key")
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    r, _ = _rpc(server, server.api_key, None, "initialize", init)
    sid = r.header("mcp-session-id")
    assert r.status == 200 and sid, (r.status, r.body)
    _rpc(server, server.api_key, sid, "notifications/initialized", rid=None)
    before = sandbox_ids(server)
    try:
        r, ans = _rpc(server, server.api_key, sid, "tools/call", {"name": "run_command", "arguments": {"command": "echo A-ONLY > /tmp/f; cat /tmp/f"}})
        assert r.status == 200 and not ans["result"].get("isError") and "A-ONLY" in json.dumps(ans["result"]), (r.status, r.body)
        sbx = session_sandbox(server, before)
        for method, params in [
            ("tools/call", {"name": "run_command", "arguments": {"command": "cat /tmp/f"}}),
            ("tools/call", {"name": "read_file", "arguments": {"path": "/tmp/f"}}),
            ("tools/call", {"name": "kill_sandbox", "arguments": {}}),
            ("tools/list", {}),
        ]:
            r, ans = _rpc(server, key_b, sid, method, params, rid=7)
            assert r.status == 404, (method, r.status, r.body)
            assert b"A-ONLY" not in r.body
        # Nor can B end the session; A's session and sandbox are untouched.
        d = http("DELETE", f"{server.url}/mcp", headers={"Mcp-Session-Id": sid, "X-API-Key": key_b})
        assert d.status == 404, (d.status, d.body)
        assert sbx in sandbox_ids(server)
        r, ans = _rpc(server, server.api_key, sid, "tools/call", {"name": "run_command", "arguments": {"command": "cat /tmp/f"}}, rid=8)
        assert r.status == 200 and "A-ONLY" in json.dumps(ans), (r.status, r.body)
    finally:
        http("DELETE", f"{server.url}/mcp", headers={"Mcp-Session-Id": sid, "X-API-Key": server.api_key})
    assert wait_until(lambda: not (sandbox_ids(server) - before), timeout=60), "the session sandbox outlived its session"
