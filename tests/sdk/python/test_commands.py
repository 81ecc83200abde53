"""`sandbox.commands` through the current Python SDK (envd process.Process over Connect JSON)."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest
from e2b import CommandExitException, NotFoundException, TimeoutException

from _util import poll


def _ps_args(sbx) -> str:
    return sbx.commands.run("ps -eo args", user="root").stdout


def test_foreground_stdout_stderr_exit_code(sandbox):
    r = sandbox.commands.run("echo out; echo err >&2; printf 'no-newline'")
    assert r.exit_code == 0
    assert r.stdout == "out\nno-newline"
    assert r.stderr == "err\n"
    assert not r.error


def test_output_callbacks(sandbox):
    out, err = [], []
    r = sandbox.commands.run(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "o1\no2\no3\n" == r.stdout
    assert "".join(err) == "e1\ne2\ne3\n" == r.stderr


def test_nonzero_exit_raises_with_code_and_output(sandbox):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("echo partial; echo boom >&2; exit 7")
    e = ei.value
    assert e.exit_code == 7
    assert e.stderr == "boom\n"
    assert e.stdout == "partial\n"
    # Not found binary: bash's 127.
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("definitely-not-a-command-xyz")
    assert ei.value.exit_code == 127
    assert "not found" in ei.value.stderr


def test_large_output(sandbox):
    r = sandbox.commands.run("head -c 5000000 /dev/zero | tr '\\0' 'a'; echo; echo tail >&2", timeout=120)
    assert len(r.stdout) == 5_000_001
    assert r.stdout[:10] == "a" * 10 and r.stdout.endswith("a\n")
    assert r.stderr == "tail\n"


def test_background_and_wait(sandbox):
    h = sandbox.commands.run("sleep 1; echo done; echo warn >&2", background=True)
    assert h.pid > 0
    assert h.pid in {p.pid for p in sandbox.commands.list()}
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "done\n"
    assert r.stderr == "warn\n"
    assert poll(lambda: h.pid not in {p.pid for p in sandbox.commands.list()}, timeout=5)


def test_background_nonzero_wait_raises(sandbox):
    h = sandbox.commands.run("sleep 0.3; exit 3", background=True)
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == 3


def test_stdin_send_and_close(sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    h.send_stdin("hello\n")
    sandbox.commands.send_stdin(h.pid, b"world\n")
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "hello\nworld\n"
    assert r.exit_code == 0


def test_stdin_binary_volume(sandbox):
    data = os.urandom(256 * 1024)
    h = sandbox.commands.run("sha256sum | cut -d' ' -f1", background=True, stdin=True)
    for i in range(0, len(data), 32 * 1024):
        h.send_stdin(data[i : i + 32 * 1024])
    sandbox.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest()


def test_stdin_closed_by_default(sandbox):
    t0 = time.monotonic()
    r = sandbox.commands.run("cat; echo rc=$?", timeout=20)
    assert r.stdout == "rc=0\n"
    assert time.monotonic() - t0 < 15


def test_envs(sandbox):
    r = sandbox.commands.run('echo "$A|$B|$C"', envs={"A": "1", "B": "two words", "C": "x=y;z"})
    assert r.stdout == "1|two words|x=y;z\n"
    # Per-command env does not leak into the next command.
    assert sandbox.commands.run('echo "${A:-unset}"').stdout == "unset\n"


def test_cwd(sandbox):
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir("/home/user/work dir")
    assert sandbox.commands.run("pwd", cwd="/home/user/work dir").stdout == "/home/user/work dir\n"


def test_user_root_vs_default(sandbox):
    r = sandbox.commands.run('whoami; id -u; id -g; echo "$HOME"')
    assert r.stdout == "user\n1000\n1000\n/home/user\n"
    r = sandbox.commands.run('whoami; id -u; id -g; echo "$HOME"', user="root")
    assert r.stdout == "root\n0\n0\n/root\n"
    r = sandbox.commands.run('whoami; id -u', user="user")
    assert r.stdout == "user\n1000\n"
    # Files created by each user are owned by that user.
    sandbox.commands.run("touch /tmp/by-user")
    sandbox.commands.run("touch /tmp/by-root", user="root")
    r = sandbox.commands.run("stat -c '%U %u' /tmp/by-user /tmp/by-root")
    assert r.stdout == "user 1000\nroot 0\n"
    # The default user cannot write root's home; root can.
    with pytest.raises(CommandExitException):
        sandbox.commands.run("touch /root/nope")
    sandbox.commands.run("touch /root/yes && ls /root/yes", user="root")
    # Unknown user is an error.
    with pytest.raises(Exception):
        sandbox.commands.run("true", user="nosuchuser")


def test_timeout_kills_the_process(sandbox):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 987", timeout=2)
    assert time.monotonic() - t0 < 10
    gone = poll(lambda: "sleep 987" not in _ps_args(sandbox), timeout=8, interval=0.5)
    assert gone, f"command still running after its timeout:\n{_ps_args(sandbox)}"
    assert not any("sleep 987" in " ".join(p.args) for p in sandbox.commands.list())


def test_kill_background_command(sandbox):
    h = sandbox.commands.run("sleep 600", background=True)
    assert "sleep 600" in _ps_args(sandbox)
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0
    assert poll(lambda: "sleep 600" not in _ps_args(sandbox), timeout=5)
    assert h.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(h.pid) is False

    # commands.kill by pid, on a command that is still producing output.
    h2 = sandbox.commands.run("while true; do echo y; sleep 0.1; done", background=True)
    assert sandbox.commands.kill(h2.pid) is True
    with pytest.raises(CommandExitException):
        h2.wait()


def test_list_reports_config(sandbox):
    h1 = sandbox.commands.run("sleep 301", background=True, envs={"MARK": "one"}, cwd="/tmp")
    h2 = sandbox.commands.run("sleep 302", background=True)
    try:
        procs = {p.pid: p for p in sandbox.commands.list()}
        assert h1.pid in procs and h2.pid in procs
        p1 = procs[h1.pid]
        assert p1.cmd == "/bin/bash"
        assert p1.args[-1] == "sleep 301"
        assert p1.envs.get("MARK") == "one"
        assert p1.cwd == "/tmp"
        assert procs[h2.pid].args[-1] == "sleep 302"
    finally:
        h1.kill()
        h2.kill()


def test_reattach_with_connect(sandbox):
    h = sandbox.commands.run("for i in 1 2 3 4; do echo tick$i; sleep 0.5; done; exit 3", background=True)
    pid = h.pid
    h.disconnect()
    # Disconnecting does not kill the command.
    assert pid in {p.pid for p in sandbox.commands.list()}
    h2 = sandbox.commands.connect(pid)
    assert h2.pid == pid
    with pytest.raises(CommandExitException) as ei:
        h2.wait()
    assert ei.value.exit_code == 3
    assert "tick4" in ei.value.stdout


def test_connect_after_exit_gets_retained_status(sandbox):
    h = sandbox.commands.run("echo bye; exit 5", background=True)
    pid = h.pid
    h.disconnect()
    time.sleep(1.0)
    h2 = sandbox.commands.connect(pid, timeout=10)
    with pytest.raises(CommandExitException) as ei:
        h2.wait()
    assert ei.value.exit_code == 5


def test_connect_unknown_pid_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999, timeout=10)


def test_concurrent_commands_in_one_sandbox(sandbox):
    results = {}

    def run(i):
        results[i] = sandbox.commands.run(f"sleep 0.5; echo n{i}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {i: r.stdout for i, r in results.items()} == {i: f"n{i}\n" for i in range(6)}
    assert time.monotonic() - t0 < 20


def test_login_shell_environment(sandbox):
    r = sandbox.commands.run('echo "$PATH"; command -v python3 curl git ps')
    path, *tools = r.stdout.splitlines()
    assert "/usr/bin" in path.split(":")
    assert [t.rsplit("/", 1)[-1] for t in tools] == ["python3", "curl", "git", "ps"]
