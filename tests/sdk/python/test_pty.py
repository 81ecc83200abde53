"""`sandbox.pty` through the current Python SDK: create, input, resize, kill."""

from __future__ import annotations

import re
import threading
import time

import pytest
from e2b import CommandExitException, PtySize


class PtyReader:
    """Drains a PTY handle in a thread and lets the test wait for output."""

    def __init__(self, handle):
        self.handle = handle
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=self._on)
        except Exception as e:  # noqa: BLE001 - recorded for the test to inspect
            self.error = e

    def _on(self, data):
        with self.lock:
            self.buf += data

    def text(self) -> str:
        with self.lock:
            return self.buf.decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 15) -> re.Match:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            m = rx.search(self.text())
            if m:
                return m
            if not self.thread.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"PTY output never matched {pattern!r}; got:\n{self.text()[-2000:]}")

    def join(self, timeout: float = 15) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def test_pty_input_and_resize(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    assert h.pid > 0
    r = PtyReader(h)
    sandbox.pty.send_stdin(h.pid, b"echo $((6*7))-marker\n")
    r.wait_for(r"42-marker")
    sandbox.pty.send_stdin(h.pid, b"stty size; tty\n")
    r.wait_for(r"24 80")
    r.wait_for(r"\n/dev/pts/\d+")

    sandbox.pty.resize(h.pid, PtySize(rows=40, cols=132))
    sandbox.pty.send_stdin(h.pid, b"stty size\n")
    r.wait_for(r"40 132")

    # Interactive programs see a terminal.
    sandbox.pty.send_stdin(h.pid, b"test -t 0 && echo is-$((1))-tty\n")
    r.wait_for(r"is-1-tty")
    # Default PTY env from the SDK.
    sandbox.pty.send_stdin(h.pid, b"echo term=$TERM\n")
    r.wait_for(r"term=xterm-256color")

    sandbox.pty.send_stdin(h.pid, b"exit 0\n")
    assert r.join(15), "PTY did not end after `exit`"
    assert r.error is None, r.error
    assert r.result.exit_code == 0


def test_pty_user_cwd_envs(sandbox):
    h = sandbox.pty.create(PtySize(rows=30, cols=100), user="root", cwd="/tmp", envs={"PTYVAR": "xyz"})
    r = PtyReader(h)
    sandbox.pty.send_stdin(h.pid, b'echo "v=$PTYVAR u=$(whoami) d=$(pwd)"\n')
    r.wait_for(r"v=xyz u=root d=/tmp")
    sandbox.pty.send_stdin(h.pid, b"exit 3\n")
    assert r.join(15)
    assert isinstance(r.error, CommandExitException)
    assert r.error.exit_code == 3


def test_pty_ctrl_c_and_kill(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    r = PtyReader(h)
    sandbox.pty.send_stdin(h.pid, b"sleep 1000; echo after-$((2))-sleep\n")
    time.sleep(0.5)
    sandbox.pty.send_stdin(h.pid, b"\x03")  # ^C interrupts the foreground job, not the shell
    sandbox.pty.send_stdin(h.pid, b"echo still-$((3))-here\n")
    r.wait_for(r"still-3-here")
    assert "after-2-sleep" not in r.text()

    assert h.pid in {p.pid for p in sandbox.commands.list()}
    assert sandbox.pty.kill(h.pid) is True
    assert r.join(15), "PTY stream did not end after kill"
    assert isinstance(r.error, CommandExitException)
    assert h.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.pty.kill(h.pid) is False


def test_pty_reconnect(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    h.disconnect()
    h2 = sandbox.pty.connect(h.pid)
    r = PtyReader(h2)
    sandbox.pty.send_stdin(h.pid, b"echo reconnected-$((1+1))\n")
    r.wait_for(r"reconnected-2")
    sandbox.pty.kill(h.pid)
    assert r.join(15)


@pytest.mark.parametrize("size", [PtySize(rows=5, cols=20), PtySize(rows=100, cols=300)])
def test_pty_initial_sizes(sandbox, size):
    h = sandbox.pty.create(size)
    r = PtyReader(h)
    sandbox.pty.send_stdin(h.pid, b"stty size; exit\n")
    r.wait_for(rf"{size.rows} {size.cols}")
    assert r.join(15)
