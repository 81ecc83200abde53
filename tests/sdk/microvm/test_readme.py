"""README.md's quick starts, unchanged, against `bulkhead serve --driver microvm` (issue 10's
"done when"): the Python and JS blocks of "Quick start" and the Python block of "Code
interpreter", each in a fresh process that has only the SDK and the E2B_* variables. The server is
this module's own, started as the README says (every template in microVMs, no `--driver-for`;
the suite's session server exercises the per-template choice). Each block kills its own sandbox.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

import readme_blocks
from bulkhead_testlib import BulkheadServer, http, processes


@pytest.fixture(scope="module")
def vm_server(server):
    # `server` (the session's) makes the suite skip loudly when QEMU or the kernel is missing.
    srv = BulkheadServer.start(
        extra_args=[
            "--driver", "microvm",
            "--guest-kernel", os.environ["BULKHEAD_GUEST_KERNEL"],
            "--templates", "base,code-interpreter-v1",
            "--pool-size", "1",
            "--pool", "code-interpreter-v1=0",
            "--pool-checkpoint", "off",
            # Disjoint from the session server's slots: each QEMU runs as its slot's own uid.
            "--uid-base", "40000000",
        ]
    )
    yield srv
    srv.kill_all_sandboxes()
    srv.stop()
    left = [p.describe() for p in processes() if p.comm.startswith("qemu-system") and f"{srv.data_dir}/" in p.cmdline]
    if os.environ.get("BULKHEAD_KEEP_DATA"):
        print(f"\nbulkhead test data kept at {srv.tmp_root}", file=sys.stderr)
    else:
        srv.cleanup_files()
    assert not left, f"VMs left running after the server stopped: {left}"


def _running(srv) -> list:
    r = http("GET", srv.url + "/v2/sandboxes", headers=srv.api_headers(), timeout=30)
    assert r.status == 200, r.body
    return [s["sandboxID"] for s in json.loads(r.body)]


@pytest.mark.timeout(600)
def test_python_quick_start(vm_server):
    out = readme_blocks.run_python(readme_blocks.blocks("Quick start", "python")[0], timeout=500, server=vm_server)
    readme_blocks.check_quick_start(out)
    assert _running(vm_server) == []


@pytest.mark.timeout(600)
def test_js_quick_start(vm_server):
    out = readme_blocks.run_js(readme_blocks.blocks("Quick start", "js")[0], timeout=500, server=vm_server)
    readme_blocks.check_quick_start(out)
    assert _running(vm_server) == []


@pytest.mark.timeout(900)
def test_code_interpreter_quick_start(vm_server):
    out = readme_blocks.run_python(readme_blocks.blocks("Code interpreter", "python")[0], timeout=800, server=vm_server)
    readme_blocks.check_code_interpreter(out)
    assert _running(vm_server) == []
