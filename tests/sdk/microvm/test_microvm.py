"""The official Python SDKs against a microvm server: lifecycle, commands, files, the network
(a denied and an allowed egress through the same egress stack as the jail, to the local test
upstreams of `egresslab`; HTTPS with credential injection trusted through the deployment's CA
in the guest's system bundle), the process limit inside the guest (a fork bomb), `run_code` in
the code interpreter (PyPI `e2b-code-interpreter`), kill, and no leaks after create/kill cycles.

Small on purpose: every sandbox is a VM booted under TCG on hosts without hardware KVM.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox, SandboxQuery, Secret

import egresslab
from bulkhead_testlib import http, processes, wait_until

CYCLES = int(os.environ.get("BULKHEAD_MICROVM_CYCLES", "10"))
FAST = 3.0  # seconds: a denied connection is refused, not left to time out


def sh(sbx, cmd: str, user: str = "user", timeout: float = 120):
    """(exit code, stdout, stderr, seconds) of a shell command; never raises on exit codes."""
    t = time.monotonic()
    try:
        r = sbx.commands.run(cmd, user=user, timeout=timeout)
    except CommandExitException as e:
        r = e
    return r.exit_code, r.stdout, r.stderr, time.monotonic() - t


def vms(server):
    """QEMU processes of this server's VMs (their command lines name its data dir)."""
    return [p for p in processes() if p.comm.startswith("qemu-system") and f"{server.data_dir}/" in p.cmdline]


def slot_dirs(server):
    slots = Path(server.data_dir) / "microvm" / "s"
    return sorted(str(d) for d in slots.iterdir()) if slots.is_dir() else []


def test_create_commands_and_files_in_a_vm(sandbox_factory):
    sbx = sandbox_factory()
    # Its own kernel: the guest's, not the host's.
    _, guest_kernel, _, _ = sh(sbx, "uname -r")
    assert guest_kernel.strip() != os.uname().release, "the sandbox runs on the host's kernel"
    r = sbx.commands.run("echo out; echo err >&2; id -un")
    assert (r.stdout, r.stderr) == ("out\nuser\n", "err\n")
    code, _, _, _ = sh(sbx, "exit 3")
    assert code == 3
    data = os.urandom(256 * 1024)
    sbx.files.write("/home/user/blob.bin", data)
    assert sbx.files.read("/home/user/blob.bin", format="bytes") == data
    names = {e.name for e in sbx.files.list("/home/user")}
    assert "blob.bin" in names
    _, out, _, _ = sh(sbx, "sha256sum /home/user/blob.bin")
    import hashlib

    assert out.split()[0] == hashlib.sha256(data).hexdigest()


def test_guest_network_is_configured_like_the_jails(sandbox_factory):
    sbx = sandbox_factory()
    _, conf, _, _ = sh(sbx, "cat /etc/resolv.conf")
    assert "nameserver 10.200.0.1" in conf, conf
    _, route, _, _ = sh(sbx, "cat /proc/net/route")
    # Default route (destination 0) via 10.200.0.1 (little-endian hex) on eth0.
    assert any(l.split()[:3] == ["eth0", "00000000", "0100C80A"] for l in route.splitlines()), route
    _, addr, _, _ = sh(sbx, "cat /proc/net/fib_trie")
    assert "10.200.0.2" in addr
    # IPv6 is off (the egress stack speaks IPv4 only).
    _, v6, _, _ = sh(sbx, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6")
    assert v6.strip() == "1"


def test_default_deny_fails_fast(sandbox_factory, lab):
    sbx = sandbox_factory()
    assert sbx.get_info().allow_internet_access is False
    before = lab.counters()
    code, _, _, took = sh(sbx, f"curl -sS -m 10 http://{egresslab.UPSTREAM_IP}/")
    assert code != 0, "a sandbox without network reached the upstream"
    assert took < FAST + 1, f"took {took:.1f}s: not refused at once"
    code, _, _, took = sh(sbx, "getent hosts api.allowed.test")
    assert code != 0 and took < FAST + 1, f"DNS without network: exit {code} in {took:.1f}s"
    after = lab.counters()
    assert after["Tcp.PassiveOpens"] == before["Tcp.PassiveOpens"], "a connection reached the upstream"


def test_allowed_and_denied_egress_through_the_egress_stack(sandbox_factory, server, lab):
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    code, body, err, _ = sh(sbx, "curl -sS -m 20 http://api.allowed.test/from-a-vm")
    assert code == 0, err
    seen = json.loads(body)
    assert seen["path"] == "/from-a-vm" and seen["tls"] is False, seen
    # TLS passes through (SNI checked by the proxy); the upstream's test CA verifies it.
    sbx.files.write("/tmp/upstream-ca.pem", lab.pki.ca_cert.read_text())
    code, body, err, _ = sh(sbx, "curl -sS -m 20 --cacert /tmp/upstream-ca.pem https://api.allowed.test/tls")
    assert code == 0, err
    assert json.loads(body)["tls"] is True
    # Not in the policy: refused at once, by name and by address.
    for url in ("http://denied.test/", f"http://{egresslab.UPSTREAM_IP}/"):
        code, _, _, took = sh(sbx, f"curl -sS -m 10 {url}")
        assert code != 0, f"{url} should be denied"
        assert took < FAST + 1, f"{url} took {took:.1f}s"
    assert "/from-a-vm" in {r["path"] for r in lab.requests()}
    # One audit trail for both drivers.
    deadline = time.monotonic() + 15
    while True:
        r = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}/network/events?limit=1000", headers=server.api_headers())
        assert r.status == 200, r.body
        ev = r.json()
        allowed = [e for e in ev if e.get("allowed") and e.get("host") == "api.allowed.test"]
        denied = [e for e in ev if not e.get("allowed")]
        if (allowed and denied) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert allowed and denied, ev
    # Network updates apply to the running VM: revoking everything cuts it off.
    r = http(
        "PUT",
        f"{server.url}/sandboxes/{sbx.sandbox_id}/network",
        {"allowOut": []},
        headers=server.api_headers(),
    )
    assert r.status in (200, 204), r.body
    code, _, _, took = sh(sbx, "curl -sS -m 10 http://api.allowed.test/after-revoke")
    assert code != 0 and took < FAST + 1, f"exit {code} after {took:.1f}s"
    assert "/after-revoke" not in {r["path"] for r in lab.requests()}
    # ...and granting it again reconnects the NIC.
    r = http(
        "PUT",
        f"{server.url}/sandboxes/{sbx.sandbox_id}/network",
        {"allowOut": ["api.allowed.test"]},
        headers=server.api_headers(),
    )
    assert r.status in (200, 204), r.body
    code, body, err, _ = sh(sbx, "curl -sS -m 20 http://api.allowed.test/regranted")
    assert code == 0, err
    assert json.loads(body)["path"] == "/regranted"


def test_https_injection_trusts_the_deployment_ca_in_the_guest(sandbox_factory, server, lab):
    name = f"bh-vm-inject-{secrets.token_hex(4)}"
    value = "sk-live-" + secrets.token_hex(20)
    Secret.create(name, value)
    try:
        sbx = sandbox_factory(
            network={
                "allow_out": ["inject.allowed.test"],
                "rules": {"inject.allowed.test": [{"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}"}}}]},
            }
        )
        # The proxy's CA is in the guest's system bundle, after the template's own roots.
        ca = (Path(server.data_dir) / "egress" / "ca.pem").read_text() if server.data_dir else ""
        bundle = sbx.files.read("/etc/ssl/certs/ca-certificates.crt")
        assert ca and ca.strip() in bundle, "the proxy's CA is not in the guest's trust bundle"
        assert bundle.index(ca.strip()) > 0, "the template's own roots are gone"
        _, mounts, _, _ = sh(sbx, "grep ca-certificates.crt /proc/self/mountinfo")
        assert " ro," in mounts, mounts
        # No --cacert: curl and Python trust the proxy through the system bundle, and the
        # sandbox's own Authorization header is replaced by the secret outside the VM.
        code, body, err, _ = sh(sbx, "curl -sS -m 20 -H 'Authorization: Bearer from-sandbox' https://inject.allowed.test/vm-inject")
        assert code == 0, err
        got = [r for r in lab.requests() if r["path"] == "/vm-inject"]
        assert got, "the upstream saw no request"
        headers = {k.lower(): v for k, v in got[-1]["headers"]}
        assert headers["authorization"] == f"Bearer {value}"
        assert value not in body
        sbx.files.write("/tmp/probe.py", "import urllib.request;print(urllib.request.urlopen('https://inject.allowed.test/vm-py').status)")
        code, out, err, _ = sh(sbx, "python3 /tmp/probe.py")
        assert code == 0 and out.strip() == "200", err
        # The secret itself never enters the VM: not in any process's environment.
        code, out, _, _ = sh(sbx, f"grep -l -s '{value}' /proc/[0-9]*/environ", user="root")
        assert out.strip() == "", out
    finally:
        Secret.destroy(name)


def test_a_fork_bomb_stays_inside_its_limit_and_the_agent_answers(sandbox_factory):
    sbx = sandbox_factory()
    limit = sbx.files.read("/sys/fs/cgroup/sandbox/pids.max").strip()
    assert limit.isdigit(), limit
    # `exec` keeps the group leader (the handle's pid) alive without a fork.
    bomb = sbx.commands.run("bomb() { bomb | bomb & }; bomb; exec sleep 100000", background=True)
    # The bomb fills its cgroup up to pids.max and no further.
    deadline = time.monotonic() + 240
    current = 0
    while time.monotonic() < deadline:
        current = int(sbx.files.read("/sys/fs/cgroup/sandbox/pids.current").strip())
        if current >= int(limit) - 2:
            break
        time.sleep(1)
    assert int(limit) - 2 <= current <= int(limit) + 2, f"pids.current {current}, pids.max {limit}"
    # The agent (outside the cgroup) still answers: files, the process list.
    sbx.files.write("/tmp/during-the-bomb", "still here")
    assert sbx.files.read("/tmp/during-the-bomb") == "still here"
    assert any(p.pid == bomb.pid for p in sbx.commands.list())
    # Killing the bomb's process group ends it; the sandbox is usable again.
    assert sbx.commands.kill(bomb.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = int(sbx.files.read("/sys/fs/cgroup/sandbox/pids.current").strip())
        if current <= 1:
            break
        time.sleep(1)
    assert current <= 1, f"{current} processes left after killing the bomb"
    r = sbx.commands.run("echo alive | cat; id -un")
    assert r.stdout == "alive\nuser\n"


@pytest.mark.timeout(900)
def test_run_code_in_the_code_interpreter_vm(server):
    """The interpreter template in a VM: Jupyter kernels on the guest kernel, state kept
    between cells (under TCG the first cell waits for the kernel: tens of seconds)."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create(timeout=600, request_timeout=600, metadata={"bulkhead-test": "microvm"})
    try:
        ex = sbx.run_code("import os; x = 6 * 7; print(os.uname().release); x", timeout=600)
        assert ex.error is None, ex.error
        assert ex.text == "42"
        assert ex.logs.stdout[0].strip() != os.uname().release, "the kernel ran on the host's kernel"
        ex = sbx.run_code("x + 1")
        assert (ex.error, ex.text) == (None, "43")
    finally:
        assert sbx.kill() is True


def test_kill_stops_the_vm(sandbox_factory, server):
    sbx = sandbox_factory()
    sh(sbx, "true")
    before = {p.pid for p in vms(server)}
    assert sbx.kill() is True
    with pytest.raises(Exception):
        sbx.commands.run("true", request_timeout=10)
    # Its QEMU is gone (the warm pool may boot a new one meanwhile: compare pids).
    gone = wait_until(lambda: len(before - {p.pid for p in vms(server)}) >= 1, timeout=30)
    assert gone, "no QEMU process ended after the kill"


@pytest.mark.timeout(1200)
def test_create_kill_cycles_leave_nothing(server, run_id):
    server.kill_all_sandboxes()
    md = {"bulkhead-test": run_id, "case": "microvm-leak"}
    t0 = time.monotonic()
    for i in range(CYCLES):
        sbx = Sandbox.create(template="base", timeout=120, metadata=md)
        r = sbx.commands.run(f"echo cycle-{i}")
        assert r.stdout == f"cycle-{i}\n"
        assert sbx.kill() is True, f"cycle {i}: kill did not find the sandbox"
    took = time.monotonic() - t0
    print(f"\n{CYCLES} microvm create/command/kill cycles in {took:.1f}s ({took / CYCLES:.2f} s each)")
    assert Sandbox.list(query=SandboxQuery(metadata=md)).next_items() == []
    server.kill_all_sandboxes()
    # Only the warm pool's VM (at most one) and its slot remain.
    settled = wait_until(lambda: len(vms(server)) <= 1 and len(slot_dirs(server)) <= 1, timeout=60, interval=1)
    assert settled, f"left behind: qemu {[p.describe() for p in vms(server)]}, slots {slot_dirs(server)}"
