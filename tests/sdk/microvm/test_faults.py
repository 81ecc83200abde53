"""Sessions that survive faults on the microvm driver (issue 23): the checks of `faultlib`, fewer
kills than on the jail (a pause or restore under TCG takes seconds of a core):
`BULKHEAD_MICROVM_FAULT_INJECTIONS` (default 8, two per verb), each at a random moment up to
`BULKHEAD_MICROVM_FAULT_MAX_DELAY` seconds (default 3: the verbs themselves take that long here)
into the verb. Runs against the suite's microvm server (`base` in VMs), which it restarts."""

from __future__ import annotations

import os
import time

from faultlib import run_injections

INJECTIONS = int(os.environ.get("BULKHEAD_MICROVM_FAULT_INJECTIONS", "8"))
MAX_DELAY = float(os.environ.get("BULKHEAD_MICROVM_FAULT_MAX_DELAY", "3"))
SEED = int(os.environ.get("BULKHEAD_FAULT_SEED", str(int(time.time()))))


def test_kill_9_at_random_points_of_microvm_verbs_loses_nothing(server):
    run_injections(server, INJECTIONS, SEED, max_delay=MAX_DELAY)
