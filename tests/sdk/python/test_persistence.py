"""Pause, resume, lifecycle, snapshots and fork through the current Python SDK (unmodified),
against a real server with the jail driver and CRIU: processes, memory, listening sockets, files
and env survive a pause; E2B's answers for pausing twice and resuming a running sandbox;
filesystem-only pauses; auto-pause at the TTL and auto-resume on traffic; snapshots as
templates; forks; a paused sandbox survives a server restart."""

from __future__ import annotations

import time
import uuid

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from _util import poll, seconds_until
from bulkhead_testlib import TEMPLATE, kill_quietly


def _md(run_id, **extra):
    return {"bulkhead-test": run_id, **extra}


def _list_all(query=None, limit=None):
    pag = Sandbox.list(query=query, limit=limit)
    items, pages = [], 0
    while pag.has_next:
        items += pag.next_items()
        pages += 1
        assert pages < 50, "paginator does not terminate"
    return items


def _snapshots(**kw):
    pag = Sandbox.list_snapshots(**kw)
    items, pages = [], 0
    while pag.has_next:
        items += pag.next_items()
        pages += 1
        assert pages < 50, "snapshot paginator does not terminate"
    return items


# A REPL-like process: executes each stdin line; its variables live only in its memory.
REPL = "python3 -u -c 'import sys\nfor line in sys.stdin: exec(line)'"
# A server on a port inside the sandbox, answering with a value it holds in memory.
SERVER = (
    "python3 -u -c 'import http.server, os\n"
    "token = os.urandom(8).hex()\n"
    "open(\"/tmp/server-token\", \"w\").write(token)\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(token.encode())\n"
    "http.server.HTTPServer((\"127.0.0.1\", 8123), H).serve_forever()'"
)


def _wait_for_server(sbx):
    sbx.commands.run(SERVER, background=True)
    r = poll(
        lambda: sbx.commands.run("curl -s http://127.0.0.1:8123/ || true").stdout.strip(),
        timeout=20,
        interval=0.3,
    )
    assert r, "the in-sandbox server did not come up"
    return r


@pytest.mark.parametrize("method", ["pause", "beta_pause"])
def test_pause_and_connect_keep_processes_memory_ports_files_and_env(sandbox_factory, method):
    sbx = sandbox_factory(timeout=300, envs={"PERSIST_ENV": "kept"})
    sbx.files.write("/home/user/note.txt", "written before the pause")
    sleeper = sbx.commands.run("sleep 3600", background=True)
    repl = sbx.commands.run(REPL, background=True, stdin=True)
    repl.send_stdin("x = 41\n")
    server_token = _wait_for_server(sbx)

    assert getattr(sbx, method)() is True
    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.state == SandboxState.PAUSED

    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.sandbox_id == sbx.sandbox_id
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    pids = [p.pid for p in again.commands.list()]
    assert sleeper.pid in pids, f"the background sleep is gone after the resume: {pids}"
    assert repl.pid in pids
    again.commands.send_stdin(repl.pid, "open('/tmp/repl-out', 'w').write(str(x + 1))\n")
    assert poll(lambda: again.files.exists("/tmp/repl-out"), timeout=10)
    assert again.files.read("/tmp/repl-out") == "42", "the REPL's variable survived in memory"
    assert again.commands.run("curl -s http://127.0.0.1:8123/").stdout.strip() == server_token
    assert again.files.read("/home/user/note.txt") == "written before the pause"
    assert again.commands.run("echo $PERSIST_ENV").stdout.strip() == "kept"
    # The TTL restarts from the resume.
    assert seconds_until(Sandbox.get_info(sbx.sandbox_id).end_at) > 200
    # Commands started after the resume work as before.
    assert again.commands.run("echo after").stdout == "after\n"


def test_a_resumed_sandbox_pauses_snapshots_and_forks_again(sandbox_factory):
    sbx = sandbox_factory(timeout=300)
    sbx.files.write("/home/user/cycles.txt", "0")
    for i in range(1, 4):
        assert sbx.pause() is True, f"pause {i}"
        sbx = Sandbox.connect(sbx.sandbox_id)
        # A process spawned after a resume.
        sbx.commands.run(f"echo -n {i} > /home/user/cycles.txt")
    assert sbx.files.read("/home/user/cycles.txt") == "3"
    snap = sbx.create_snapshot()
    try:
        forks = sbx.fork(count=1, timeout=120)
        (fork,) = forks
        assert not isinstance(fork, Exception), fork
        assert fork.files.read("/home/user/cycles.txt") == "3"
        fork.kill()
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_pause_twice_and_resume_running_behave_as_e2b(sandbox_factory):
    sbx = sandbox_factory(timeout=300)
    # Connecting to a running sandbox only extends it.
    same = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert same.sandbox_id == sbx.sandbox_id
    assert sbx.pause() is True
    assert sbx.pause() is False, "pausing a paused sandbox answers 409, which the SDK maps to False"
    assert Sandbox.pause(sbx.sandbox_id) is False
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.commands.run("echo ok").stdout == "ok\n"


def test_paused_state_in_get_and_list_with_filters_and_pagination(sandbox_factory, run_id):
    tag = uuid.uuid4().hex[:8]
    md = _md(run_id, persist=tag)
    paused = [sandbox_factory(timeout=300, metadata=md) for _ in range(3)]
    running = sandbox_factory(timeout=300, metadata=md)
    for s in paused:
        assert s.pause() is True
    by_state = lambda states, limit=None: {  # noqa: E731
        i.sandbox_id for i in _list_all(SandboxQuery(metadata={"persist": tag}, state=states), limit)
    }
    ids_paused = {s.sandbox_id for s in paused}
    assert by_state([SandboxState.PAUSED]) == ids_paused
    assert by_state([SandboxState.RUNNING]) == {running.sandbox_id}
    assert by_state([SandboxState.RUNNING, SandboxState.PAUSED]) == ids_paused | {running.sandbox_id}
    # Pages of one.
    assert by_state([SandboxState.PAUSED], limit=1) == ids_paused
    listed = [i for i in _list_all(SandboxQuery(metadata={"persist": tag}, state=[SandboxState.PAUSED]))]
    assert all(i.state == SandboxState.PAUSED for i in listed)
    for s in paused:
        Sandbox.kill(s.sandbox_id)
    assert by_state([SandboxState.PAUSED]) == set(), "killing a paused sandbox removes it"


def test_filesystem_only_pause_keeps_files_not_processes(sandbox_factory):
    sbx = sandbox_factory(timeout=300, envs={"PERSIST_ENV": "kept"})
    sbx.files.write("/home/user/fs.txt", "on disk")
    sleeper = sbx.commands.run("sleep 3600", background=True)
    sbx.commands.run("sync")
    assert sbx.pause(mode="filesystem") is True
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/home/user/fs.txt") == "on disk"
    assert sleeper.pid not in [p.pid for p in again.commands.list()], "processes are gone"
    assert again.commands.run("echo $PERSIST_ENV").stdout.strip() == "kept"


def test_connect_with_reboot_boots_a_full_pause_afresh_on_its_files(sandbox_factory):
    sbx = sandbox_factory(timeout=300, envs={"PERSIST_ENV": "kept"})
    sbx.files.write("/home/user/reboot.txt", "on disk")
    sleeper = sbx.commands.run("sleep 3600", background=True)
    sbx.commands.run("sync")
    assert sbx.pause() is True
    again = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
    assert again.files.read("/home/user/reboot.txt") == "on disk"
    assert sleeper.pid not in [p.pid for p in again.commands.list()], "a reboot has no old processes"
    assert again.commands.run("echo $PERSIST_ENV").stdout.strip() == "kept"


def test_on_timeout_pause_then_connect(sandbox_factory):
    sbx = sandbox_factory(timeout=5, lifecycle={"on_timeout": "pause"})
    sbx.files.write("/home/user/ttl.txt", "survives the TTL")
    sleeper = sbx.commands.run("sleep 3600", background=True)
    info = sbx.get_info()
    assert info.lifecycle and info.lifecycle["on_timeout"] == "pause"
    assert poll(lambda: Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED, timeout=60), (
        "not paused at the end of its TTL"
    )
    again = Sandbox.connect(sbx.sandbox_id, timeout=120)
    assert again.files.read("/home/user/ttl.txt") == "survives the TTL"
    assert sleeper.pid in [p.pid for p in again.commands.list()]


def test_auto_resume_on_envd_traffic(sandbox_factory):
    sbx = sandbox_factory(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    sbx.files.write("/home/user/auto.txt", "auto")
    assert sbx.get_info().lifecycle["auto_resume"] is True
    assert sbx.pause() is True
    # The next envd request (through E2B_SANDBOX_URL) resumes it, then proceeds.
    assert sbx.files.read("/home/user/auto.txt") == "auto"
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING


def test_traffic_to_a_paused_sandbox_without_auto_resume_fails_until_connect(sandbox_factory):
    sbx = sandbox_factory(timeout=120)
    assert sbx.pause() is True
    with pytest.raises(Exception):
        sbx.commands.run("echo no", request_timeout=20)
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.commands.run("echo yes").stdout == "yes\n"


def test_snapshots_named_list_create_from_and_delete(sandbox_factory):
    src = sandbox_factory(timeout=300)
    src.files.write("/home/user/snap.txt", "from the snapshot")
    name = f"bh-snap-{uuid.uuid4().hex[:8]}"
    made = []
    snap = src.create_snapshot(name=name)
    anon = None
    try:
        assert snap.snapshot_id.startswith(name)
        assert any(n.startswith(name) for n in snap.names)
        # The source runs on.
        assert src.commands.run("echo running").stdout == "running\n"
        anon = src.create_snapshot()

        all_ids = {s.snapshot_id for s in _snapshots()}
        assert {snap.snapshot_id, anon.snapshot_id} <= all_ids
        mine = {s.snapshot_id for s in _snapshots(sandbox_id=src.sandbox_id)}
        assert mine == {snap.snapshot_id, anon.snapshot_id}
        assert {s.snapshot_id for s in _snapshots(name=name)} == {snap.snapshot_id}
        assert {s.snapshot_id for s in _snapshots(sandbox_id=src.sandbox_id, limit=1)} == mine

        # Two sandboxes from it: independent copies.
        a = Sandbox.create(template=snap.snapshot_id, timeout=120)
        made.append(a)
        b = Sandbox.create(template=snap.snapshot_id, timeout=120)
        made.append(b)
        assert a.files.read("/home/user/snap.txt") == "from the snapshot"
        a.files.write("/home/user/snap.txt", "changed in a")
        assert b.files.read("/home/user/snap.txt") == "from the snapshot"
        assert src.files.read("/home/user/snap.txt") == "from the snapshot"
        assert a.sandbox_id != b.sandbox_id != src.sandbox_id

        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert snap.snapshot_id not in {s.snapshot_id for s in _snapshots()}
    finally:
        kill_quietly(made)
        for s in (snap, anon):
            if s is not None:
                try:
                    Sandbox.delete_snapshot(s.snapshot_id)
                except Exception:
                    pass


def test_fork_two_independent_copies(sandbox_factory):
    parent = sandbox_factory(timeout=300)
    parent.files.write("/home/user/fork.txt", "parent")
    sleeper = parent.commands.run("sleep 3600", background=True)
    forks = parent.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for f in forks:
            assert not isinstance(f, Exception), f
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 2 and parent.sandbox_id not in ids
        for f in forks:
            assert f.files.read("/home/user/fork.txt") == "parent"
            assert sleeper.pid in [p.pid for p in f.commands.list()]
        forks[0].files.write("/home/user/fork.txt", "fork 0")
        assert forks[1].files.read("/home/user/fork.txt") == "parent"
        assert parent.files.read("/home/user/fork.txt") == "parent"
        assert sleeper.pid in [p.pid for p in parent.commands.list()], "the parent runs on untouched"
        assert Sandbox.get_info(parent.sandbox_id).state == SandboxState.RUNNING
    finally:
        kill_quietly([f for f in forks if not isinstance(f, Exception)])


def test_paused_sandbox_survives_a_server_restart(server, sandbox_factory):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by the suite (BULKHEAD_TEST_URL points at an external one)")
    sbx = sandbox_factory(timeout=300)
    sbx.files.write("/home/user/restart.txt", "kept on disk")
    sleeper = sbx.commands.run("sleep 3600", background=True)
    assert sbx.pause() is True

    server.restart()

    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("/home/user/restart.txt") == "kept on disk"
    assert sleeper.pid in [p.pid for p in again.commands.list()]
    time.sleep(0.1)
    assert again.commands.run("echo alive").stdout == "alive\n"


def test_network_policy_and_secret_injection_come_back_after_resume_and_in_forks(sandbox_factory, lab):
    import json
    import secrets as pysecrets

    from e2b import Secret
    from test_network import curl

    name = f"bh-persist-{pysecrets.token_hex(4)}"
    value = "sk-live-" + pysecrets.token_hex(20)
    Secret.create(name, value)
    forks = []
    try:
        sbx = sandbox_factory(
            timeout=300,
            network={
                "allow_out": ["inject.allowed.test"],
                "rules": {"inject.allowed.test": [{"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}"}}}]},
            },
        )

        def injected(s, path):
            code, _, err, _ = curl(s, f"https://inject.allowed.test{path}")
            assert code == 0, err
            # The lab records a request once its handler has run: poll briefly.
            got = poll(lambda: [r for r in lab.requests() if r["path"] == path], timeout=5, interval=0.1)
            assert got, f"the upstream saw no {path}"
            return {k.lower(): v for k, v in got[-1]["headers"]}["authorization"]

        assert injected(sbx, "/before-pause") == f"Bearer {value}"
        assert sbx.pause() is True
        again = Sandbox.connect(sbx.sandbox_id)
        assert injected(again, "/after-resume") == f"Bearer {value}"
        code, _, _, _ = curl(again, "http://denied.test/")
        assert code != 0, "the policy still denies what it denied"
        forks = again.fork(count=1, timeout=120)
        (fork,) = forks
        assert not isinstance(fork, Exception), fork
        assert injected(fork, "/in-fork") == f"Bearer {value}"
        # The parent's link came back after the fork's snapshot too.
        assert injected(again, "/parent-after-fork") == f"Bearer {value}"
        assert json.loads(curl(again, "https://inject.allowed.test/x")[1])["path"] == "/x"
    finally:
        kill_quietly([f for f in forks if not isinstance(f, Exception)])
        Secret.destroy(name)
