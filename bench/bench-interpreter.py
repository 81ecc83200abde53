#!/usr/bin/env python3
"""Code-interpreter latency benchmark: Bulkhead through the official `e2b-code-interpreter` SDK
against a bare ipykernel on the host, measured in the same run by the same Python process.

Run it with the interpreter test venv (it has the SDK, `jupyter_client` and `ipykernel`), against
a running server, configured like the SDK (E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY) or with
--url/--api-key:

    V=$(ls -d /var/cache/bulkhead/venv-* | ...)   # or: python3 -m venv /tmp/ci && /tmp/ci/bin/pip install -r tests/sdk/interpreter/requirements.txt
    /tmp/ci/bin/python bench/bench-interpreter.py --url http://127.0.0.1:3000 --api-key e2b_…

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

Load mode (`--load RATE`, the target of issue 14 item 4): first `--n-idle` creates one at a time
(`--idle-pause` apart, so each is a warm-pool claim) give the idle create→first run_code p50;
then creates are started at RATE per second for `--duration` seconds, each in its own thread
followed by `run_code("1+1")` (the sandbox is killed afterwards, outside the timed region). It
prints successes, p50/p95/p99, the p50 against the idle p50 of the same run, and CPU per create:
system-wide busy jiffies from /proc/stat over the load phase plus a settle time for the pool to
refill (`--settle`), divided by the creates; with `--server-pid` also the server's own CPU and its
reaped children's (CRIU), and with `--data-dir` the sandboxes' cgroup CPU (cpuacct/cpu.stat of the
server's `bulkhead/<instance>` subtree). On a machine shared with other work the system-wide figure
includes that work; the per-process and cgroup figures do not.

Density mode (`--density N`, issue 9: target <= 60 MiB per idle sandbox): host `MemAvailable`
(/proc/meminfo; the median of 5 reads 1 s apart) with the server idle and its pools full, then
with N idle code-interpreter sandboxes created one at a time (`--pause` apart, so each is a pool
claim and the pool refills to the same size) and left alone for `--settle` seconds, then again
after they are killed. Per sandbox: the drop from before to during, and (less exposed to drift)
the rise from during to after, each divided by N. With `--data-dir` also the sandboxes' memory
cgroups (v1 `memory.usage_in_bytes`, v2 `memory.current`: page cache of the shared tree included,
so higher than the host figure). Other work on the machine moves MemAvailable: run it quiet.

First-JS mode (`--first-js N`, target <= 1 s): N fresh sandboxes; in each the first
`run_code("1+1", language="js")` is timed (the Deno kernel starts on first use), then a second
one on the same sandbox, the warm baseline of the same run.

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


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    return sum(fields) - fields[3] - fields[4]


def process_cpu_s(pid: int) -> tuple:
    """(own, reaped children) CPU seconds of `pid` from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(rest[i]) for i in (11, 12, 13, 14))
    return (utime + stime) / hz, (cutime + cstime) / hz


def sandbox_cgroup_cpu_s(data_dir: str) -> Optional[float]:
    """CPU seconds charged to the server's sandbox cgroups (v1 cpuacct or v2 cpu.stat)."""
    import hashlib

    instance = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:8]
    for path, kind in (
        (f"/sys/fs/cgroup/cpuacct/bulkhead/{instance}/cpuacct.usage", "v1"),
        (f"/sys/fs/cgroup/cpu,cpuacct/bulkhead/{instance}/cpuacct.usage", "v1"),
        (f"/sys/fs/cgroup/bulkhead/{instance}/cpu.stat", "v2"),
        (f"/sys/fs/cgroup/unified/bulkhead/{instance}/cpu.stat", "v2"),
    ):
        try:
            text = open(path).read()
        except OSError:
            continue
        if kind == "v1":
            return int(text.strip()) / 1e9
        for line in text.splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1]) / 1e6
    return None


def mem_available_kib(reads: int = 5) -> float:
    vals = []
    for i in range(reads):
        if i:
            time.sleep(1)
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    vals.append(int(line.split()[1]))
    return statistics.median(vals)


def sandbox_cgroup_mem_bytes(data_dir: str) -> Optional[int]:
    """Memory charged to the server's sandbox cgroups (v1 memory.usage_in_bytes, v2 memory.current)."""
    import hashlib

    instance = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:8]
    for path in (
        f"/sys/fs/cgroup/memory/bulkhead/{instance}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/bulkhead/{instance}/memory.current",
        f"/sys/fs/cgroup/unified/bulkhead/{instance}/memory.current",
    ):
        try:
            return int(open(path).read().strip())
        except (OSError, ValueError):
            continue
    return None


def density_mode(args, Sandbox, create_kw) -> int:
    n = args.density
    print(f"bench-interpreter density: {n} idle sandboxes, pause {args.pause:g} s, settle {args.settle:g} s", flush=True)
    time.sleep(args.settle)
    before = mem_available_kib()
    cg_before = sandbox_cgroup_mem_bytes(args.data_dir) if args.data_dir else None
    made = []
    try:
        for _ in range(n):
            made.append(Sandbox.create(**create_kw))
            if args.pause:
                time.sleep(args.pause)
        # Every sandbox answers (none is a corpse counted as free memory).
        for sbx in made:
            if sbx.run_code("1+1").text != "2":
                raise RuntimeError("an idle sandbox did not answer run_code")
        time.sleep(args.settle)
        during = mem_available_kib()
        cg_during = sandbox_cgroup_mem_bytes(args.data_dir) if args.data_dir else None
    finally:
        for sbx in made:
            try:
                sbx.kill()
            except Exception as e:  # keep killing the others
                print(f"kill failed: {e}", file=sys.stderr)
    time.sleep(args.settle)
    after = mem_available_kib()
    mib = lambda kib: kib / 1024.0
    print(f"MemAvailable before {mib(before):.0f} MiB, with {n} sandboxes {mib(during):.0f} MiB, after kill {mib(after):.0f} MiB")
    print(f"per idle sandbox: {mib(before - during) / n:.1f} MiB (before→during), {mib(after - during) / n:.1f} MiB (during→after kill)")
    if cg_before is not None and cg_during is not None:
        print(f"sandbox cgroups: {(cg_during - cg_before) / n / 2**20:.1f} MiB per sandbox (page cache included)")
    return 0


def first_js_mode(args, Sandbox, create_kw) -> int:
    first, second, failures = [], [], []
    for _ in range(args.first_js):
        if args.pause:
            time.sleep(args.pause)
        sbx = Sandbox.create(**create_kw)
        try:
            t0 = time.perf_counter()
            ex = sbx.run_code("1+1", language="js")
            t1 = time.perf_counter()
            ex2 = sbx.run_code("1+1", language="js")
            t2 = time.perf_counter()
            if ex.text != "2" or ex2.text != "2":
                raise RuntimeError(f"returned {ex.text!r}/{ex2.text!r} error={ex.error or ex2.error}")
            first.append(t1 - t0)
            second.append(t2 - t1)
        except Exception as e:
            failures.append(str(e).splitlines()[0][:200])
        finally:
            sbx.kill()
    warm = Row("bulkhead: second JS run_code (same sandbox)", second)
    print(warm.line())
    print(Row("bulkhead: first JS run_code on a fresh sandbox", first).line(warm))
    if failures:
        print(f"FAILED in {len(failures)} of {args.first_js} sandboxes, e.g.: {failures[0]}")
    return 1 if failures else 0


def create_and_run(Sandbox, create_kw) -> float:
    t0 = time.perf_counter()
    sbx = Sandbox.create(**create_kw)
    try:
        ex = sbx.run_code("1+1")
        took = time.perf_counter() - t0
        if ex.text != "2":
            raise RuntimeError(f"run_code returned {ex.text!r} error={ex.error}")
        return took
    finally:
        sbx.kill()


def load_mode(args, Sandbox, create_kw) -> int:
    import threading

    print(f"idle: {args.n_idle} creates, {args.idle_pause:g} s apart", flush=True)
    idle, idle_fail = [], []
    for _ in range(args.n_idle):
        time.sleep(args.idle_pause)
        try:
            idle.append(create_and_run(Sandbox, create_kw))
        except Exception as e:
            idle_fail.append(str(e).splitlines()[0][:200])
    time.sleep(args.idle_pause)

    n = int(round(args.load * args.duration))
    print(f"load: {n} creates at {args.load:g}/s over {args.duration:g} s, each + run_code(\"1+1\")", flush=True)
    lat, fails = [None] * n, []
    lock = threading.Lock()

    def one(i: int):
        try:
            lat[i] = create_and_run(Sandbox, create_kw)
        except Exception as e:
            with lock:
                fails.append(str(e).splitlines()[0][:200])

    cg0 = sandbox_cgroup_cpu_s(args.data_dir) if args.data_dir else None
    srv0 = process_cpu_s(args.server_pid) if args.server_pid else None
    j0, w0 = busy_jiffies(), time.perf_counter()
    threads = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / args.load - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    load_wall = time.perf_counter() - w0
    time.sleep(args.settle)
    j1 = busy_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    ok = [x for x in lat if x is not None]

    idle_row = Row("idle: create→first run_code", idle)
    load_row = Row(f"load {args.load:g}/s: create→first run_code", ok)
    print(idle_row.line())
    print(load_row.line(idle_row))
    print(f"load: {len(ok)}/{n} OK ({100.0 * len(ok) / max(n, 1):.1f} %), load phase {load_wall:.1f} s + settle {args.settle:g} s")
    if fails:
        print(f"load: {len(fails)} failed, e.g.: {fails[0]}")
    if idle_fail:
        print(f"idle: {len(idle_fail)} failed, e.g.: {idle_fail[0]}")
    busy_s = (j1 - j0) / hz
    print(f"CPU system-wide: {busy_s:.2f} s busy over {load_wall + args.settle:.1f} s = {1e3 * busy_s / max(n, 1):.0f} ms per create")
    if srv0 is not None:
        own, kids = (b - a for a, b in zip(srv0, process_cpu_s(args.server_pid)))
        print(f"CPU server process: {own:.2f} s ({1e3 * own / max(n, 1):.1f} ms per create), its reaped children (CRIU, launcher): {kids:.2f} s ({1e3 * kids / max(n, 1):.1f} ms per create)")
    if cg0 is not None:
        cg1 = sandbox_cgroup_cpu_s(args.data_dir)
        if cg1 is not None:
            d = cg1 - cg0
            print(f"CPU sandbox cgroups: {d:.2f} s ({1e3 * d / max(n, 1):.1f} ms per create, includes restores and pool refills)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"idle_ms": idle_row.ms, "load_ms": load_row.ms, "failures": fails, "busy_s": busy_s}, f, indent=1)
    return 1 if fails or idle_fail else 0


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
    ap.add_argument("--load", type=float, default=0.0, help="load mode: creates per second (issue 14: 5)")
    ap.add_argument("--duration", type=float, default=20.0, help="load mode: seconds of load")
    ap.add_argument("--n-idle", type=int, default=10, help="load mode: idle creates for the baseline")
    ap.add_argument("--idle-pause", type=float, default=2.0, help="load mode: seconds between idle creates")
    ap.add_argument("--settle", type=float, default=5.0, help="load mode: seconds after the load counted for CPU (pool refill); density mode: seconds to settle before each reading")
    ap.add_argument("--server-pid", type=int, help="load mode: the server's pid, for its own CPU figures")
    ap.add_argument("--data-dir", help="load/density mode: the server's data dir, for its sandboxes' cgroup CPU and memory")
    ap.add_argument("--density", type=int, default=0, help="density mode: idle sandboxes to hold (issue 9: 30)")
    ap.add_argument("--first-js", type=int, default=0, help="first-JS mode: fresh sandboxes to sample")
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

    if args.load > 0:
        return load_mode(args, Sandbox, create_kw)
    if args.density > 0:
        return density_mode(args, Sandbox, create_kw)
    if args.first_js > 0:
        return first_js_mode(args, Sandbox, create_kw)

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
