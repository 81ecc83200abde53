#!/usr/bin/env python3
"""Template build times through the official Python SDK against a `bulkhead serve` started here.

  cold    from_base_image + copy + run_cmd + run_cmd, with a fresh file each time (every step runs)
  cached  the same template rebuilt unchanged (every step CACHED)
  pull    from_image of an image pushed to a loopback `docker-registry` just before, a new digest
          each time (download, unpack, prepare: a cold pull), no steps

Prints p50/p95/p99 of each over N builds and the ratios cached/cold and pull/cold (measured in
the same run). Everything stays on this machine (the registry is on 127.0.0.1; docker.io is
mirrored to it). The image-cache entries the benchmark made (layers of its unique files,
pulled bench images) are removed at the end; sandboxes are killed before the server stops.

Usage: venv python bench/bench-template.py [-n 10]
  env: BULKHEAD_BIN (default target/debug/bulkhead), BULKHEAD_IMAGE_CACHE
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sdk"))

import registrylab  # noqa: E402
from bulkhead_testlib import BulkheadServer  # noqa: E402

MARK = "bulkhead-bench"


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def show(label, xs):
    print(
        f"{label:<8} n={len(xs):<3} p50={pct(xs, 50):7.3f}s p95={pct(xs, 95):7.3f}s "
        f"p99={pct(xs, 99):7.3f}s min={min(xs):7.3f}s mean={statistics.mean(xs):7.3f}s",
        flush=True,
    )


def bench_cache_entries(cache: Path, before: set) -> list:
    """Entries this run added that are its own: layers of its steps, its pulled images."""
    mine = []
    for e in cache.iterdir():
        if e.name in before or not (e / "READY").exists():
            continue
        try:
            ready = (e / "READY").read_text()
        except OSError:
            continue
        if MARK in ready:
            mine.append(e)
    return mine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10)
    args = ap.parse_args()
    if registrylab.missing():
        sys.exit(registrylab.missing())

    from e2b import Template  # the venv's official SDK

    cache = Path(os.environ.get("BULKHEAD_IMAGE_CACHE", "/var/cache/bulkhead/images"))
    before = {e.name for e in cache.iterdir()} if cache.exists() else set()
    reg = registrylab.Registry()
    srv = None
    ctx = Path(tempfile.mkdtemp(prefix="bulkhead-bench-tpl-", dir="/var/tmp"))
    try:
        srv = BulkheadServer.start(
            ["--registry-mirror", f"docker.io=http://{reg.host}", "--registry-insecure", reg.host, "--pool-size", "0"]
        )
        os.environ.update(E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=srv.api_key)
        name = f"bench-{uuid.uuid4().hex[:8]}"

        def template(nonce: str):
            (ctx / "app.txt").write_text(f"{MARK} {nonce}\n")
            return (
                Template(file_context_path=str(ctx))
                .from_base_image()
                .copy("app.txt", f"/opt/{MARK}/app.txt")
                .run_cmd(f"echo {MARK} > /opt/{MARK}/step.txt", user="root")
                .run_cmd(f"cat /opt/{MARK}/app.txt /opt/{MARK}/step.txt > /opt/{MARK}/all.txt # {MARK}", user="root")
            )

        def timed(t, n, check=None):
            logs = []
            t0 = time.monotonic()
            Template.build(t, n, on_build_logs=logs.append)
            dt = time.monotonic() - t0
            if check:
                text = "\n".join(str(l.message) for l in logs)
                assert check(text), text
            return dt

        # Warm-up (server start, SDK imports, the base template's first sandbox).
        timed(template("warmup"), name)
        cold, cached = [], []
        for i in range(args.n):
            nonce = uuid.uuid4().hex
            cold.append(timed(template(nonce), name, lambda t: "CACHED" not in t))
            cached.append(timed(template(nonce), name, lambda t: t.count("CACHED [") == 3))
        pull = []
        tiny = registrylab.tiny_rootfs()
        for i in range(args.n):
            ref = f"{MARK}/img:{i}"
            reg.push(ref, [tiny, registrylab.file_layer({"/etc/bench": uuid.uuid4().hex})], env={"PATH": "/usr/bin:/bin"})
            pull.append(
                timed(
                    Template().from_image(f"{reg.host}/{ref}").set_envs({"B": "1"}),
                    f"{name}-img",
                    lambda t: "pulled in" in t,
                )
            )
        print(f"\ntemplate builds, {args.n} each (cold: every step runs; cached: all steps CACHED; "
              f"pull: from_image cold pull of a {len(tiny) // 1_000_000} MB image from loopback)")
        show("cold", cold)
        show("cached", cached)
        show("pull", pull)
        print(f"ratio cached/cold p50 = {pct(cached, 50) / pct(cold, 50):.3f}  "
              f"p95 = {pct(cached, 95) / pct(cold, 95):.3f}")
        print(f"ratio pull/cold p50 = {pct(pull, 50) / pct(cold, 50):.3f}")
        print(json.dumps({"cold": cold, "cached": cached, "pull": pull}), file=sys.stderr)
    finally:
        if srv is not None:
            srv.kill_all_sandboxes()
            srv.stop()
            srv.cleanup_files()
        reg.stop()
        shutil.rmtree(ctx, ignore_errors=True)
        if cache.exists():
            for e in bench_cache_entries(cache, before):
                shutil.rmtree(e, ignore_errors=True)


if __name__ == "__main__":
    main()
