"""Server restarts and sandbox deaths: running sandboxes are re-adopted with their files and
processes; streams end promptly when their sandbox goes away."""

from __future__ import annotations

import threading
import time

import pytest
from e2b import Sandbox


def test_running_sandbox_survives_server_restart(server, sandbox_factory):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by the suite (BULKHEAD_TEST_URL points at an external one)")
    sbx = sandbox_factory(timeout=600)
    sbx.files.write("/home/user/before-restart.txt", "still here")
    bg = sbx.commands.run("sleep 600", background=True)
    end_before = sbx.get_info().end_at

    server.restart()

    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/home/user/before-restart.txt") == "still here"
    pids = [p.pid for p in again.commands.list()]
    assert bg.pid in pids, f"background process {bg.pid} lost across the restart: {pids}"
    assert again.commands.run("echo alive").stdout == "alive\n"
    assert again.get_info().end_at >= end_before, "the TTL must survive the restart"
    assert again.commands.kill(bg.pid) is True


def test_stream_ends_when_sandbox_is_killed(sandbox_factory):
    sbx = sandbox_factory(timeout=600)
    handle = sbx.commands.run("sleep 600", background=True)
    outcome = {}

    def wait():
        t0 = time.monotonic()
        try:
            handle.wait()
            outcome["result"] = "returned"
        except Exception as e:  # the SDK raises on a broken stream
            outcome["result"] = type(e).__name__
        outcome["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.5)
    assert Sandbox.kill(sbx.sandbox_id) is True
    t.join(timeout=15)
    assert not t.is_alive(), "the command stream kept hanging after its sandbox was killed"
    assert outcome["elapsed"] < 10, f"stream ended only after {outcome['elapsed']:.1f}s ({outcome['result']})"
    assert outcome["result"] != "returned", "wait() reported success for a command whose sandbox was killed"
