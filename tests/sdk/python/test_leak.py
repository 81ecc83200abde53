"""Leak test: 200 create/kill cycles through the SDK leave nothing behind.

Two checks:
1. While the server runs: after the cycles, what sandboxes hold on the host (processes in the
   slot uid ranges or of the agent binary, mounts under the data dir other than the reusable
   idmapped lower layers `jail/l/…`, cgroups under the bulkhead parent, non-empty slot dirs)
   settles back to what it was before them (the warm pool and other live sandboxes included).
2. When this suite owns the server: after killing every sandbox and stopping the server (which
   stops its warm pool), nothing at all is left but the lower mounts.

Marked `slow` (required in CI; deselect locally with `-m "not slow"`); runs last.
"""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox, SandboxQuery

from bulkhead_testlib import TEMPLATE, HostState, wait_until

CYCLES = 200

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _not_above(baseline: HostState, server):
    now = HostState.capture(server.data_dir, server.pid)
    b, n = baseline.counts(), now.counts()
    return now if all(n[k] <= b[k] for k in n) else None


def test_200_create_kill_cycles_leave_nothing(server, run_id):
    if server.owned:
        # Start from a quiet server: only the warm pool is left running.
        server.kill_all_sandboxes()
        time.sleep(3)
    baseline = HostState.capture(server.data_dir, server.pid)
    md = {"bulkhead-test": run_id, "case": "leak"}
    t0 = time.monotonic()
    for i in range(CYCLES):
        sbx = Sandbox.create(template=TEMPLATE, timeout=120, metadata=md)
        if i % 10 == 0:
            r = sbx.commands.run(f"echo cycle-{i}")
            assert r.stdout == f"cycle-{i}\n"
            sbx.files.write(f"/tmp/cycle-{i}.txt", "x" * 4096)
        assert sbx.kill() is True, f"cycle {i}: kill did not find the sandbox"
    elapsed = time.monotonic() - t0
    print(f"\n{CYCLES} create/kill cycles in {elapsed:.1f}s ({elapsed / CYCLES * 1000:.0f} ms each)")

    pag = Sandbox.list(query=SandboxQuery(metadata=md))
    assert pag.next_items() == [], "killed sandboxes still listed"

    settled = wait_until(lambda: _not_above(baseline, server), timeout=90, interval=1)
    if not settled:
        now = HostState.capture(server.data_dir, server.pid)
        pytest.fail(
            "host resources did not return to the pre-cycle level after 200 create/kill cycles\n"
            f"before:\n{baseline.describe()}\nafter:\n{now.describe()}"
        )

    if not server.owned:
        return  # an external server keeps running; the shutdown check needs our own

    # Kill everything, stop the server (it stops its warm pool), and expect a clean host.
    server.kill_all_sandboxes()
    code = server.stop(timeout=120)
    assert code == 0, f"server exited with {code} on SIGTERM"

    def clean():
        st = HostState.capture(server.data_dir, None)
        st.cgroups = [c for c in st.cgroups if c not in server.cgroups_before or _has_procs(c)]
        return st if not any(st.counts().values()) else None

    if not wait_until(clean, timeout=30, interval=1):
        st = HostState.capture(server.data_dir, None)
        pytest.fail(
            "leftovers after killing every sandbox and stopping the server "
            "(only the idmapped lower mounts under jail/l may stay):\n" + st.describe()
        )


def _has_procs(cg: str) -> bool:
    try:
        with open(f"{cg}/cgroup.procs") as f:
            return bool(f.read().strip())
    except OSError:
        return False
