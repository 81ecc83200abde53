"""Sessions that survive faults on the jail driver (issue 23): `BULKHEAD_FAULT_INJECTIONS` kills
(default 100, spread evenly over pause, resume, snapshot and fork) of the test's own server at a
random moment 0–400 ms into the verb, each followed by a restart and the checks of `faultlib`.
The server is the test's own (jail driver, CRIU, no warm pool); its sandboxes are killed and its
snapshots deleted through the API before it stops. `BULKHEAD_FAULT_SEED` replays a run."""

from __future__ import annotations

import os
import time

import pytest

from bulkhead_testlib import TEMPLATE, own_server
from faultlib import run_injections

INJECTIONS = int(os.environ.get("BULKHEAD_FAULT_INJECTIONS", "100"))
SEED = int(os.environ.get("BULKHEAD_FAULT_SEED", str(int(time.time()))))


@pytest.fixture(scope="module")
def srv(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs servers started by the suite (it starts and kills its own)")
    args = ["--templates", TEMPLATE, "--uid-base", "330000000", "--pool-size", "0"]
    with own_server(args) as s:
        yield s


def test_kill_9_at_random_points_loses_nothing(srv):
    run_injections(srv, INJECTIONS, SEED, max_delay=0.4)
