"""`kill -9` of the server in the middle of a pause and of a resume: after the restart the sandbox
is either running or paused and resumable — never lost, never half-restored and counted as
running — and it comes back with its files and processes."""

from __future__ import annotations

import pytest
from e2b import Sandbox

from faultlib import kill_and_restart


def _assert_whole(sandbox_id: str, marker: str, pid: int):
    state = Sandbox.get_info(sandbox_id).state
    assert str(state).lower().endswith(("running", "paused")), state
    again = Sandbox.connect(sandbox_id, timeout=300)
    assert Sandbox.get_info(sandbox_id).state.value == "running"
    assert again.files.read("/home/user/marker.txt") == marker
    pids = [p.pid for p in again.commands.list()]
    assert pid in pids, f"background process {pid} lost: {pids} (state before connect: {state})"
    assert again.commands.run("echo alive").stdout == "alive\n"


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.4])
def test_kill_9_during_pause(server, sandbox_factory, delay):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by the suite (BULKHEAD_TEST_URL points at an external one)")
    sbx = sandbox_factory(timeout=600)
    marker = f"pause-{delay}"
    sbx.files.write("/home/user/marker.txt", marker)
    bg = sbx.commands.run("sleep 100000", background=True)
    kill_and_restart(server, sbx.beta_pause, delay, f"pause + {delay} s")
    _assert_whole(sbx.sandbox_id, marker, bg.pid)


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.4])
def test_kill_9_during_resume(server, sandbox_factory, delay):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by the suite (BULKHEAD_TEST_URL points at an external one)")
    sbx = sandbox_factory(timeout=600)
    marker = f"resume-{delay}"
    sbx.files.write("/home/user/marker.txt", marker)
    bg = sbx.commands.run("sleep 100000", background=True)
    assert sbx.beta_pause() is True
    kill_and_restart(server, lambda: Sandbox.connect(sbx.sandbox_id), delay, f"resume + {delay} s")
    _assert_whole(sbx.sandbox_id, marker, bg.pid)


def test_repeated_pause_resume_keeps_state_and_confinement(sandbox_factory):
    """A resumed sandbox can be paused again (nothing the restore left behind blocks the next
    checkpoint), every resume keeps /proc a read-only mount, and processes started after a resume
    can use `sudo` as in a fresh sandbox (no `no_new_privs`)."""
    sbx = sandbox_factory(timeout=600)
    sbx.files.write("/home/user/marker.txt", "cycles")
    bg = sbx.commands.run("sleep 100000", background=True)
    for i in range(4):
        assert sbx.beta_pause() is True, f"pause {i}"
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert sbx.files.read("/home/user/marker.txt") == "cycles"
        assert bg.pid in [p.pid for p in sbx.commands.list()]
        r = sbx.commands.run("echo 500 > /proc/self/oom_score_adj || echo denied")
        assert r.stdout.strip().endswith("denied"), f"cycle {i}: {r.stdout!r} {r.stderr!r}"
        r = sbx.commands.run(f"grep NoNewPrivs /proc/self/status && sudo -n mkdir /cycle{i} && stat -c %U /cycle{i}")
        assert r.stdout.split() == ["NoNewPrivs:", "0", "root"], f"cycle {i}: {r.stdout!r}"


def test_pauses_succeed_while_processes_come_and_go(sandbox_factory):
    """Item 6 of issue 23: a pause right as processes exit (a loop forking short-lived commands,
    and a command that has just finished) succeeds; CRIU's seize is retried when a process
    vanishes under it."""
    sbx = sandbox_factory(timeout=600)
    sbx.commands.run("sh -c 'while :; do /bin/true; done'", background=True, timeout=0)
    for i in range(15):
        sbx.commands.run("true")
        assert sbx.pause() is True, f"pause {i}"
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert sbx.commands.run("echo up").stdout == "up\n", f"cycle {i}"
