"""Fault injection shared by the jail and microvm suites (issue 23): `kill -9` of a server at a
random moment of a pause, a resume, a snapshot or a fork, then a restart and checks through the
official SDK:

- `/health` answers within 5 s of the restart;
- the sandbox is running or paused, never gone; resumed, its files (content, owner, mode, mtime
  to the nanosecond, a deleted template file, a set-uid file) and a process's in-memory secret
  are unchanged;
- every snapshot the server lists starts and holds the same files and memory; a fork that got
  made is whole; nothing else is left running;
- every fourth kill, the next pause, resume, snapshot and fork work.

The delays come from a seeded generator; the seed is printed for replays."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from e2b import Sandbox

from bulkhead_testlib import TEMPLATE, http, wait_until

HEALTHY_WITHIN = 5.0

# Holds a secret only in its memory and serves it on a port inside the sandbox.
SECRET_SERVER = (
    "python3 -u -c 'import http.server, os\n"
    "token = os.urandom(8).hex()\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(token.encode())\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer((\"127.0.0.1\", 8123), H).serve_forever()'"
)
FILES = """
set -e
mkdir -p /home/user/f
head -c 262144 /dev/urandom > /home/user/f/data.bin
echo owned > /home/user/f/owned && chown user:user /home/user/f/owned && chmod 0640 /home/user/f/owned
touch -d '2021-03-04 05:06:07.123456789' /home/user/f/owned
cp /bin/true /home/user/f/suid && chmod 4755 /home/user/f/suid
rm -f /etc/issue
"""
FINGERPRINT = (
    "md5sum /home/user/f/data.bin; "
    "stat -c '%n %U:%G %a %y' /home/user/f/owned /home/user/f/suid; "
    "test -e /etc/issue && echo issue-back || echo issue-gone"
)


def secret(sbx: Sandbox) -> str:
    return sbx.commands.run("curl -s --max-time 5 http://127.0.0.1:8123/ || true").stdout.strip()


class Subject:
    """The sandbox under test and what it must keep."""

    def __init__(self, srv):
        self.srv = srv
        # Forks inherit the tag: how the checks tell them from anything else running.
        self.tag = os.urandom(6).hex()
        self.sbx = Sandbox.create(TEMPLATE, timeout=3600, metadata={"faultlib": self.tag})
        self.id = self.sbx.sandbox_id
        self.sbx.commands.run(FILES, user="root")
        # No command timeout: the SDK's default (60 s) ends a background command too.
        self.sbx.commands.run(SECRET_SERVER, background=True, timeout=0)
        self.secret = wait_until(lambda: secret(self.sbx), timeout=30)
        assert len(self.secret) == 16, self.secret
        self.fingerprint = self.sbx.commands.run(FINGERPRINT).stdout
        assert "issue-gone" in self.fingerprint and "4755" in self.fingerprint, self.fingerprint

    def check(self, sbx: Sandbox, what: str):
        assert sbx.commands.run(FINGERPRINT).stdout == self.fingerprint, what
        got = secret(sbx)
        if got != self.secret:
            diag = sbx.commands.run("curl -sS --max-time 5 http://127.0.0.1:8123/ 2>&1; ps -eo pid,stat,etime,cmd 2>&1 || true")
            log = [line for line in self.srv.log_tail(400).splitlines() if "request_id" not in line][-40:]
            for agent_log in sorted(self.srv.data_dir.glob("jail/s/*/sock/agent.log")):
                log.append(f"--- {agent_log}")
                log += agent_log.read_text(errors="replace").splitlines()[-25:]
            assert got == self.secret, (
                f"{what}: the in-memory secret changed; in the sandbox:\n{diag.stdout}\nserver log:\n" + "\n".join(log)
            )

    def resumed(self, what: str) -> Sandbox:
        state = Sandbox.get_info(self.id).state.value
        assert state in ("running", "paused"), f"{what}: sandbox is {state}"
        try:
            self.sbx = Sandbox.connect(self.id, timeout=3600)
        except Exception as e:
            log = [line for line in self.srv.log_tail(400).splitlines() if "WARN" in line or "ERROR" in line]
            raise AssertionError(f"{what}: resuming failed: {e}\nserver log:\n" + "\n".join(log[-20:])) from e
        assert Sandbox.get_info(self.id).state.value == "running", what
        self.check(self.sbx, what)
        return self.sbx


def kill_and_restart(srv, action, delay: float, what: str):
    outcome = {}

    def run():
        try:
            outcome["result"] = action()
        except Exception as e:  # the server died under the request
            outcome["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(delay)
    os.kill(srv.pid, signal.SIGKILL)
    srv.proc.wait(timeout=30)
    t.join(timeout=60)
    assert not t.is_alive(), f"{what}: the request did not end with the server"
    offset = srv.log_size()
    started = time.monotonic()
    srv._spawn()
    while True:
        try:
            if http("GET", srv.url + "/health", timeout=1).status == 204:
                break
        except OSError:
            pass
        took = time.monotonic() - started
        assert took < HEALTHY_WITHIN, f"{what}: /health silent {took:.1f}s after the restart:\n{srv.log_since(offset, 150)}"
        assert srv.proc.poll() is None, f"{what}: the server exited:\n{srv.log_since(offset, 150)}"
        time.sleep(0.05)
    return outcome.get("result")


def settle_extras(srv, subject: Subject, what: str):
    """Listed snapshots start whole (then go); made forks are whole (then go)."""
    for snap in Sandbox.list_snapshots().next_items():
        copy = Sandbox.create(snap.snapshot_id, timeout=120)
        try:
            subject.check(copy, f"{what}: snapshot {snap.snapshot_id}")
        finally:
            copy.kill()
        Sandbox.delete_snapshot(snap.snapshot_id)
    r = http("GET", f"{srv.url}/v2/sandboxes?state=running&state=paused&limit=100", headers={"X-API-Key": srv.api_key})
    for other in r.json():
        if other["sandboxID"] == subject.id or (other.get("metadata") or {}).get("faultlib") != subject.tag:
            continue
        fork = Sandbox.connect(other["sandboxID"], timeout=120)
        try:
            subject.check(fork, f"{what}: fork {other['sandboxID']}")
        finally:
            fork.kill()


def verbs_work(subject: Subject, what: str):
    assert subject.sbx.pause() is True, f"{what}: the next pause"
    subject.resumed(f"{what}: the next resume")
    snap = subject.sbx.create_snapshot()
    try:
        (fork,) = subject.sbx.fork(count=1, timeout=120)
        assert not isinstance(fork, Exception), f"{what}: the next fork: {fork}"
        subject.check(fork, f"{what}: the next fork")
        fork.kill()
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


VERBS = ["pause", "resume", "snapshot", "fork"]


def run_injections(srv, injections: int, seed: int, max_delay: float):
    """`injections` kills of `srv` at uniform random moments up to `max_delay` seconds into the
    four verbs in turn, each checked as the module docs say."""
    rng = random.Random(seed)
    print(f"fault injection: {injections} kills, seed {seed} (BULKHEAD_FAULT_SEED replays it)")
    subject = Subject(srv)
    try:
        for n in range(injections):
            verb = VERBS[n % len(VERBS)]
            delay = rng.uniform(0.0, max_delay)
            what = f"injection {n} ({verb} + {delay * 1000:.0f} ms, seed {seed})"
            sbx = subject.sbx
            if verb == "pause":
                action = sbx.pause
            elif verb == "resume":
                assert sbx.pause() is True, f"{what}: pausing first"
                action = lambda: Sandbox.connect(subject.id, timeout=3600)  # noqa: E731
            elif verb == "snapshot":
                action = sbx.create_snapshot
            else:
                action = lambda: sbx.fork(count=1, timeout=120)  # noqa: E731
            kill_and_restart(srv, action, delay, what)
            subject.resumed(what)
            settle_extras(srv, subject, what)
            if n % len(VERBS) == len(VERBS) - 1:
                verbs_work(subject, what)
    finally:
        for snap in Sandbox.list_snapshots().next_items():
            Sandbox.delete_snapshot(snap.snapshot_id)
        Sandbox.kill(subject.id)
