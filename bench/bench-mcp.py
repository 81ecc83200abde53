#!/usr/bin/env python3
"""MCP `run_code` round trip against the code-interpreter SDK's `run_code` on the same server, in
the same run, by the same Python process.

Run it with the MCP test venv (tests/sdk/mcp/requirements.txt: PyPI `mcp` and
`e2b-code-interpreter`) against a running server (--url/--api-key, or E2B_API_URL/E2B_API_KEY):

    V=/var/cache/bulkhead/venv-<hash of tests/sdk/mcp/requirements.txt>
    $V/bin/python bench/bench-mcp.py --url http://127.0.0.1:3000 --api-key e2b_… -n 200

Rows (wall-clock `time.perf_counter` per call, after `--warmup` unmeasured calls):

- sdk run_code        `Sandbox.run_code("1+1")` of `e2b-code-interpreter` on one warm sandbox
                      (a new HTTP connection per call, POST /execute through the routing proxy).
- mcp run_code        `Client.call_tool("run_code", {"code": "1+1"})` of the official `mcp`
                      client over Streamable HTTP, one session, its default sandbox (created by
                      the first, unmeasured call): JSON-RPC over POST /mcp, the session's tool
                      call, then the same /execute to the agent over the engine's agent stream.
- mcp stdio run_code  the same through `bulkhead mcp --stdio` (the relay adds one hop) when
                      --stdio-bin is given.

Every result is checked ("2"). The ratio is each row's p50 (and p95) against the sdk row. Every
sandbox is killed through the API at the end (the MCP session's when its client closes).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import statistics
import time

import anyio


def pct(samples, p):
    s = sorted(samples)
    k = max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))
    return s[k]


def row(name, samples, base=None):
    p50, p95, p99 = (pct(samples, p) * 1000 for p in (50, 95, 99))
    line = f"{name:<20} n={len(samples):<4} p50={p50:7.2f} ms  p95={p95:7.2f} ms  p99={p99:7.2f} ms  mean={statistics.mean(samples) * 1000:7.2f} ms"
    if base:
        line += f"  p50 ratio={p50 / (pct(base, 50) * 1000):.2f}x  p95 ratio={p95 / (pct(base, 95) * 1000):.2f}x"
    print(line, flush=True)


def bench_sdk(n, warmup):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(timeout=600, metadata={"bulkhead-bench": "mcp"})
    try:
        for _ in range(warmup):
            sbx.run_code("1+1")
        out = []
        for _ in range(n):
            t = time.perf_counter()
            ex = sbx.run_code("1+1")
            out.append(time.perf_counter() - t)
            assert ex.text == "2", ex
        return out
    finally:
        sbx.kill()


async def bench_mcp_client(client, n, warmup):
    out = []
    async with client as c:
        for _ in range(warmup):
            await c.call_tool("run_code", {"code": "1+1"})
        for _ in range(n):
            t = time.perf_counter()
            r = await c.call_tool("run_code", {"code": "1+1"})
            out.append(time.perf_counter() - t)
            assert not r.is_error and json.loads(r.content[0].text)["results"][0]["text"] == "2", r
    return out


def http_client(url, key):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers={"X-API-Key": key}))
    return Client(transport, read_timeout_seconds=120)


def stdio_client(binary, url, key):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=binary, args=["mcp", "--stdio"], env={"E2B_API_URL": url, "E2B_API_KEY": key})
    return Client(params, read_timeout_seconds=120)


def kill_all(url, key):
    import urllib.request

    ids = []
    # The SDK's sandbox, and any MCP session sandbox a crashed client left behind.
    for md in ("bulkhead-bench%3Dmcp", "bulkhead.mcp%3Dsession"):
        req = urllib.request.Request(f"{url}/v2/sandboxes?limit=100&metadata={md}", headers={"X-API-Key": key})
        with urllib.request.urlopen(req, timeout=30) as r:
            ids += [s["sandboxID"] for s in json.load(r)]
    for sid in ids:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/sandboxes/{sid}", method="DELETE", headers={"X-API-Key": key}), timeout=30)
        except urllib.error.HTTPError as e:
            if e.code != 404:  # 404: its MCP session ended and killed it meanwhile
                raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("E2B_API_URL", "http://127.0.0.1:3000"))
    ap.add_argument("--api-key", default=os.environ.get("E2B_API_KEY"))
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--stdio-bin", help="the bulkhead binary, to also measure `bulkhead mcp --stdio`")
    a = ap.parse_args()
    if not a.api_key:
        ap.error("--api-key or E2B_API_KEY is required")
    os.environ.update(E2B_API_URL=a.url, E2B_SANDBOX_URL=a.url, E2B_API_KEY=a.api_key)
    try:
        sdk = bench_sdk(a.n, a.warmup)
        mcp = anyio.run(bench_mcp_client, http_client(a.url, a.api_key), a.n, a.warmup)
        stdio = None
        if a.stdio_bin:
            stdio = anyio.run(bench_mcp_client, stdio_client(a.stdio_bin, a.url, a.api_key), a.n, a.warmup)
    finally:
        kill_all(a.url, a.api_key)
    print(f"run_code('1+1') round trip, {a.n} samples each after {a.warmup} warm-up calls, server {a.url}")
    row("sdk run_code", sdk)
    row("mcp run_code", mcp, sdk)
    if stdio:
        row("mcp stdio run_code", stdio, sdk)


if __name__ == "__main__":
    main()
