"""pytest wiring for the microvm SDK suite: the official Python SDK against a `bulkhead serve
--driver microvm` (every sandbox a QEMU microVM; TCG where the host has no hardware KVM).

tests/sdk/conftest.py supplies the log capture and the `sandbox_factory` fixtures; this file
replaces the session's `server` with one whose `base` and `code-interpreter-v1` templates run
in microVMs (`--driver-for`; a warm pool of one `base` VM) and skips the whole suite, loudly, when QEMU or the guest kernel is missing. The guest
kernel comes from `BULKHEAD_GUEST_KERNEL` (scripts/test.sh sets it from
scripts/guest-kernel.sh).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

import egresslab
from bulkhead_testlib import BulkheadServer, processes

QEMU = "qemu-system-x86_64"


def missing() -> str | None:
    if shutil.which(QEMU) is None:
        return f"`{QEMU}` is not installed (apt-get install qemu-system-x86)"
    kernel = os.environ.get("BULKHEAD_GUEST_KERNEL")
    if not kernel:
        return "BULKHEAD_GUEST_KERNEL is not set (export it as $(scripts/guest-kernel.sh)/bzImage)"
    if not Path(kernel).is_file():
        return f"the guest kernel {kernel} does not exist (build it with scripts/guest-kernel.sh)"
    if os.environ.get("BULKHEAD_TEST_URL"):
        return "BULKHEAD_TEST_URL points at an external server; this suite starts its own microvm server"
    return None


@pytest.fixture(scope="session")
def server():
    why = missing()
    if why:
        print(f"\nSKIPPED: microvm SDK suite: {why}", file=sys.stderr)
        pytest.skip(f"SKIPPED: microvm SDK suite: {why}")
    pki = None
    # The jail stays the default driver and `base` runs in VMs: the per-template choice is
    # what is exercised (`--driver microvm` alone is the same driver for every template).
    extra = [
        "--driver", "jail",
        "--driver-for", "base=microvm,code-interpreter-v1=microvm",
        "--guest-kernel", os.environ["BULKHEAD_GUEST_KERNEL"],
        "--templates", "base,code-interpreter-v1",
        # One warm `base` VM and no warm interpreter VM: a TCG boot costs seconds of a core
        # (the interpreter's tens); more would slow the rest of CI.
        "--pool-size", "1",
        "--pool", "code-interpreter-v1=0",
        "--pool-checkpoint", "off",
    ]
    if egresslab.missing_tools() is None:
        pki = egresslab.TestPki()
        extra += egresslab.serve_args(pki)
    srv = BulkheadServer.start(extra_args=extra)
    srv.egress_pki = pki
    os.environ["E2B_API_URL"] = srv.url
    os.environ["E2B_SANDBOX_URL"] = srv.url
    os.environ["E2B_API_KEY"] = srv.api_key
    for k in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        os.environ.pop(k, None)
    no_proxy = os.environ.get("NO_PROXY", "")
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(x for x in (no_proxy, "127.0.0.1", "localhost") if x)
    yield srv
    # Every sandbox is killed through the API before the server stops.
    srv.kill_all_sandboxes()
    srv.stop()
    # Stopping the server stops its warm pool: no VM of this data dir may be left running.
    left = [p.describe() for p in processes() if p.comm.startswith("qemu-system") and f"{srv.data_dir}/" in p.cmdline]
    if pki is not None:
        pki.cleanup()
    if os.environ.get("BULKHEAD_KEEP_DATA"):
        print(f"\nbulkhead test data kept at {srv.tmp_root}", file=sys.stderr)
    else:
        srv.cleanup_files()
    assert not left, f"VMs left running after the server stopped: {left}"

