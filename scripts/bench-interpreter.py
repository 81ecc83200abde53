#!/usr/bin/env python3
"""Code-interpreter latency benchmark: Bulkhead through the official `e2b-code-interpreter` SDK
against a bare ipykernel on the host, measured in the same run by the same Python process.

Run it with the interpreter test venv (it has the SDK, `jupyter_client` and `ipykernel`), against
a running server, configured like the SDK (E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY) or with
--url/--api-key:

    V=$(ls -d /var/cache/bulkhead/venv-* | ...)   # or: python3 -m venv /tmp/ci && /tmp/ci/bin/pip install -r tests/sdk/interpreter/requirements.txt
    /tmp/ci/bin/python scripts/bench-interpreter.py --url http://127.0.0.1:3000 --api-key e2b_…

Method (every sample is wall-clock time in this process, `time.perf_counter`):

- bulkhead: create→first run_code   `Sandbox.create()` (SDK default template
  `code-interpreter-v1`) followed by `run_code("1+1")` returning "2"; the sandbox is killed after
  each sample, outside the timed region.
- bulkhead: warm run_code           `run_code("1+1")` on one already-used sandbox (default python
  context), after a few unmeasured warm-up calls. This is the SDK's full path: a new HTTP/1.1
  connection per call (the SDK builds one per `run_code`), POST /execute through the server's
  routing proxy to the agent, the agent's Jupyter-protocol round trip to the kernel over ZeroMQ,
  and the NDJSON stream back until `end_of_execution`.
- bulkhead: raw /execute keep-alive  the same request with `http.client` on one persistent
  connection, to separate the SDK's per-call connection setup from the server's own cost.
- bare ipykernel: execute           the baseline: an ipykernel started on the host with
  `jupyter_client.KernelManager` (same Python as this script), `execute_interactive("1+1")`
  timed from sending `execute_request` until the kernel's `status: idle` on IOPub with the
  `execute_result` "2" seen, i.e. the same Jupyter round trip the agent performs, without any
  sandbox, HTTP or proxy in between.
- bare ipykernel: start→first execute  `KernelManager.start_kernel()` + `wait_for_ready()` +
  the first execute: what "create → first run_code" costs without a sandbox (a fresh kernel).

Ratios are p50 against the bare-kernel row of the same kind. The kernel inside the sandbox also
loads Bulkhead's startup module (formatters registered lazily), the host kernel does not unless
--bare-exec-file is given.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import List, Optional


def pct(samples: List[float], p: float) -> float:
    v = sorted(samples)
    if not v:
        return float("nan")
    idx = round((p / 100.0) * (len(v) - 1))
    return v[min(idx, len(v) - 1)]


class Row:
    def __init__(self, name: str, samples_s: List[float]):
        self.name = name
        self.ms = [s * 1e3 for s in samples_s]

    def p(self, q: float) -> float:
        return pct(self.ms, q)

    def line(self, base: Optional["Row"] = None) -> str:
        s = f"{self.name:<42} n={len(self.ms):<4} p50={self.p(50):9.2f}ms p95={self.p(95):9.2f}ms p99={self.p(99):9.2f}ms"
        if base is not None and base.ms:
            s += f"  ×{self.p(50) / base.p(50):.2f} p50 vs {base.name}"
        return s


def bare_kernel(n_warm: int, n_cold: int, exec_files: List[str]):
    from jupyter_client import KernelManager

    extra = [f"--IPKernelApp.exec_files={json.dumps(exec_files)}"] if exec_files else []

    def start():
        km = KernelManager(kernel_name="python3")
        km.start_kernel(extra_arguments=extra, stderr=subprocess.DEVNULL)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        return km, kc

    def execute(kc) -> None:
        seen = []

        def hook(msg):
            if msg["msg_type"] == "execute_result":
                seen.append(msg["content"]["data"].get("text/plain"))

        reply = kc.execute_interactive("1+1", output_hook=hook, timeout=60)
        if reply["content"]["status"] != "ok" or seen != ["2"]:
            raise RuntimeError(f"bare kernel answered {reply['content']['status']} {seen!r}")

    cold = []
    for _ in range(n_cold):
        t0 = time.perf_counter()
        km, kc = start()
        execute(kc)
        cold.append(time.perf_counter() - t0)
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    km, kc = start()
    try:
        for _ in range(10):
            execute(kc)
        warm = []
        for _ in range(n_warm):
            t0 = time.perf_counter()
            execute(kc)
            warm.append(time.perf_counter() - t0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return warm, cold


def raw_execute_keepalive(sbx, n: int) -> List[float]:
    base = urllib.parse.urlsplit(os.environ["E2B_SANDBOX_URL"])
    conn = http.client.HTTPConnection(base.hostname, base.port or 80, timeout=60)
    headers = {
        "Content-Type": "application/json",
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "49999",
    }
    tok = getattr(sbx, "_envd_access_token", None)
    if tok:
        headers["X-Access-Token"] = tok
    body = json.dumps({"code": "1+1", "context_id": None, "language": None, "env_vars": None})

    def once():
        conn.request("POST", "/execute", body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200 or b'"text":"2"' not in data.replace(b" ", b""):
            raise RuntimeError(f"/execute answered {r.status}: {data[:300]!r}")

    for _ in range(5):
        once()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        once()
        out.append(time.perf_counter() - t0)
    conn.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="server base URL (sets E2B_API_URL and E2B_SANDBOX_URL)")
    ap.add_argument("--api-key", help="API key (sets E2B_API_KEY)")
    ap.add_argument("--n-create", type=int, default=20, help="create→first run_code samples")
    ap.add_argument("--n-warm", type=int, default=200, help="warm run_code samples (each side)")
    ap.add_argument("--template", default=None, help="template (default: the SDK's code-interpreter-v1)")
    ap.add_argument("--bare-exec-file", action="append", default=[], help="exec_files for the host kernel")
    ap.add_argument("--json", help="also write the raw samples (ms) to this file")
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to wait between creates, so the warm pool refills (its kernels start) and every "
        "create is a pool claim; 0 measures back-to-back creates that drain the pool",
    )
    args = ap.parse_args()

    if args.url:
        os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = args.url.rstrip("/")
    if args.api_key:
        os.environ["E2B_API_KEY"] = args.api_key
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        if not os.environ.get(k):
            print(f"bench-interpreter: {k} is not set (use --url/--api-key or the SDK's env vars)", file=sys.stderr)
            return 2
    host = urllib.parse.urlsplit(os.environ["E2B_SANDBOX_URL"]).hostname or ""
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(x for x in (os.environ.get("NO_PROXY", ""), host, "127.0.0.1", "localhost") if x)

    from e2b_code_interpreter import Sandbox

    create_kw = {"timeout": 600}
    if args.template:
        create_kw["template"] = args.template

    print(
        f"bench-interpreter: run_code(\"1+1\"), {args.n_create} creates (pause {args.pause:g} s), "
        f"{args.n_warm} warm calls per side",
        flush=True,
    )

    warm_bare, cold_bare = bare_kernel(args.n_warm, max(3, min(args.n_create, 10)), args.bare_exec_file)

    create_first, create_only, failures = [], [], []
    for _ in range(args.n_create):
        if args.pause:
            time.sleep(args.pause)
        t0 = time.perf_counter()
        sbx = Sandbox.create(**create_kw)
        t1 = time.perf_counter()
        try:
            ex = sbx.run_code("1+1")
            t2 = time.perf_counter()
            if ex.text != "2":
                raise RuntimeError(f"returned {ex.text!r} error={ex.error}")
        except Exception as e:  # counted and shown, not timed: a failed sample is no latency
            failures.append(str(e).splitlines()[0][:200])
            continue
        finally:
            sbx.kill()
        create_only.append(t1 - t0)
        create_first.append(t2 - t0)

    sbx = Sandbox.create(**create_kw)
    try:
        for _ in range(10):
            sbx.run_code("1+1")
        warm_sdk = []
        for _ in range(args.n_warm):
            t0 = time.perf_counter()
            ex = sbx.run_code("1+1")
            warm_sdk.append(time.perf_counter() - t0)
            if ex.text != "2":
                raise RuntimeError(f"run_code returned {ex.text!r} error={ex.error}")
        warm_raw = raw_execute_keepalive(sbx, args.n_warm)
    finally:
        sbx.kill()

    bare_w = Row("bare ipykernel: execute", warm_bare)
    bare_c = Row("bare ipykernel: start→first execute", cold_bare)
    rows = [
        (bare_w, None),
        (Row("bulkhead: warm run_code (SDK)", warm_sdk), bare_w),
        (Row("bulkhead: raw /execute keep-alive", warm_raw), bare_w),
        (bare_c, None),
        (Row("bulkhead: Sandbox.create()", create_only), None),
        (Row("bulkhead: create→first run_code (SDK)", create_first), bare_c),
    ]
    for row, base in rows:
        print(row.line(base))
    if failures:
        print(f"FAILED first run_code in {len(failures)} of {args.n_create} fresh sandboxes, e.g.: {failures[0]}")
    print(
        f"(warm SDK mean {statistics.mean(warm_sdk) * 1e3:.2f} ms, bare mean {statistics.mean(warm_bare) * 1e3:.2f} ms)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({r.name: r.ms for r, _ in rows}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
