"""Isolation, checked from inside sandboxes through the SDK: host processes, files and loopback
are invisible; the mount API, nested namespaces, AF_VSOCK, bpf & co fail with EPERM; fork and
memory bombs are contained; the file API cannot escape to the host; sandboxes cannot see each
other."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from e2b import CommandExitException, NotFoundException, SandboxException

from _util import poll
from bulkhead_testlib import REPO, SLOT_UID_MIN, http, processes

USERS = ("user", "root")
DOCKER_DEFAULT_CAPS = 0xA80425FB


@pytest.fixture(params=["fresh", "resumed", "forked"])
def sandbox(request, sandbox_factory):
    """Every isolation check runs on a fresh sandbox, on one paused (memory kept) and resumed,
    and on a fork: a restored sandbox must be confined exactly as a started one (CRIU brings
    back namespaces, seccomp, capabilities and read-only mounts; the agent re-applies Landlock to
    what it spawns)."""
    from e2b import Sandbox

    sbx = sandbox_factory()
    if request.param == "fresh":
        return sbx
    # Something running across the checkpoint, as in real sessions.
    sbx.commands.run("sleep 100000", background=True)
    if request.param == "resumed":
        assert sbx.beta_pause() is True
        return Sandbox.connect(sbx.sandbox_id)
    forks = sbx.fork(count=1)
    assert len(forks) == 1 and not isinstance(forks[0], Exception), forks
    request.addfinalizer(lambda: forks[0].kill())
    return forks[0]


def run_py(sbx, code: str, user: str = "user", timeout: float = 60):
    """Run a Python program in the sandbox; returns the CommandResult (never raises on exit)."""
    path = f"/tmp/probe-{secrets.token_hex(4)}.py"
    sbx.files.write(path, code, user=user)
    try:
        return sbx.commands.run(f"python3 {path}", user=user, timeout=timeout)
    except CommandExitException as e:
        return e


# ---- processes --------------------------------------------------------------------------------

PROC_SCAN = r"""
import json, os
out = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append([int(p), cmd])
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS)
def test_cannot_see_host_processes(sandbox, server, user):
    seen = json.loads(run_py(sandbox, PROC_SCAN, user=user).stdout)
    cmds = [c for _, c in seen]
    assert len(seen) < 40, f"too many processes visible: {seen}"
    joined = "\n".join(cmds)
    assert "bulkhead serve" not in joined
    assert "pytest" not in joined
    if server.pid:
        # The server's pid, if it exists in the sandbox at all, is some sandbox process.
        for pid, cmd in seen:
            if pid == server.pid:
                assert "bulkhead" not in cmd or "serve" not in cmd
    ps = sandbox.commands.run("ps -eo pid=,user=,args=", user=user).stdout
    assert "pytest" not in ps and "bulkhead serve" not in ps
    # pid 1 of the sandbox is not the host's init.
    host_init = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    sbx_init = dict(seen).get(1, "").strip()
    assert sbx_init != host_init or not host_init


def test_uids_are_mapped_to_a_private_range(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    ha = a.commands.run("sleep 4322", background=True)
    hb = b.commands.run("sleep 4321", background=True)
    try:

        def host_uid(marker):
            for p in processes():
                if p.cmdline == f"sleep {marker}":
                    return p.uid
            return None

        ua = poll(lambda: host_uid(4322), timeout=5)
        ub = poll(lambda: host_uid(4321), timeout=5)
        assert ua is not None and ub is not None, "sandbox processes not found on the host"
        assert ua >= SLOT_UID_MIN and ub >= SLOT_UID_MIN, (ua, ub)
        assert ua != ub, "two sandboxes share a host uid"
        assert ua not in (0, 1000) and ub not in (0, 1000)
    finally:
        ha.kill()
        hb.kill()


# ---- files --------------------------------------------------------------------------------------


@pytest.fixture
def host_marker(server):
    """A secret on the host: in the data dir when we know it, else in a host temp dir."""
    base = server.data_dir if server.data_dir else Path(tempfile.mkdtemp(prefix="bulkhead-host-"))
    path = Path(base) / f"host-secret-{secrets.token_hex(6)}.txt"
    secret = "HOST-SECRET-" + secrets.token_hex(16)
    path.write_text(secret)
    os.chmod(path, 0o600)
    yield path, secret
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("user", USERS)
def test_cannot_see_host_files(sandbox, server, host_marker, user):
    path, secret = host_marker
    candidates = [str(path), str(path.parent), str(REPO), str(REPO / "Cargo.toml"), "/root/.cargo", "/root/.pyenv", "/var/cache/bulkhead"]
    if server.data_dir:
        candidates += [str(server.data_dir), str(server.data_dir / "jail")]
    if server.tmp_root:
        candidates.append(str(server.tmp_root / "server.log"))
    probe = "import json, os, sys\nprint(json.dumps({p: os.path.exists(p) for p in json.loads(sys.argv[1])}))\n"
    sandbox.files.write("/tmp/exists.py", probe, user=user)
    r = sandbox.commands.run(f"python3 /tmp/exists.py '{json.dumps(candidates)}'", user=user)
    visible = [p for p, e in json.loads(r.stdout).items() if e]
    assert visible == [], f"host paths visible in the sandbox: {visible}"
    r = sandbox.commands.run(f"cat {path}; echo rc=$?", user=user)
    assert secret not in r.stdout
    # No host block devices, KVM or vsock.
    devs = sandbox.commands.run("ls /dev", user=user).stdout.split()
    for d in ("kvm", "vda", "sda", "vsock", "mem", "kmem", "port"):
        assert d not in devs, f"/dev/{d} visible: {devs}"


def test_file_api_refuses_dotdot_and_symlink_escapes(sandbox, server, host_marker):
    path, secret = host_marker
    host_shadow = Path("/etc/shadow").read_text()
    sbx_shadow = sandbox.commands.run("cat /etc/shadow", user="root").stdout
    assert sbx_shadow != host_shadow
    # `..` cannot climb above the sandbox root: these all name the sandbox's /etc/shadow.
    for p in ("../../../../../../etc/shadow", "/../../../etc/shadow", "/home/user/../../../../etc/shadow"):
        assert sandbox.files.read(p, user="root") == sbx_shadow, p
    # Host paths, directly or via `..`, do not exist.
    for p in (str(path), "../../../../../../.." + str(path)):
        with pytest.raises(NotFoundException):
            sandbox.files.read(p, user="root")
        assert sandbox.files.exists(p, user="root") is False
    # Symlinks created inside the sandbox resolve inside the sandbox.
    sandbox.commands.run(
        f"ln -s {path} /home/user/l-abs && ln -s ../../../../../../..{path} /home/user/l-rel && "
        f"ln -s /proc/1/root/etc/shadow /home/user/l-proc && ln -s /proc/{server.pid or 1}/root{path} /home/user/l-srv"
    )
    for link in ("/home/user/l-abs", "/home/user/l-rel", "/home/user/l-srv"):
        try:
            content = sandbox.files.read(link, user="root")
        except SandboxException:
            continue
        assert secret not in content, link
    try:
        via_proc = sandbox.files.read("/home/user/l-proc", user="root")
        assert via_proc == sbx_shadow and via_proc != host_shadow
    except SandboxException:
        pass  # refusing /proc/1/root is fine too
    for link in ("/home/user/l-abs", "/home/user/l-rel", "/home/user/l-srv", "/home/user/l-proc"):
        try:
            dl = requests.get(sandbox.download_url(link, user="root"), proxies={"http": None}, timeout=30)
            assert secret not in dl.text and host_shadow not in dl.text
        except requests.RequestException:
            pass
    # Writes through `..` and symlinks never land on the host.
    host_dir = Path(tempfile.mkdtemp(prefix="bulkhead-escape-", dir="/var/tmp"))
    try:
        sandbox.commands.run(f"ln -s {host_dir}/via-link /home/user/w-link && ln -s {host_dir} /home/user/w-dirlink")
        attempts = [
            lambda: sandbox.files.write("/home/user/w-link", "pwned"),
            lambda: sandbox.files.write("/home/user/w-dirlink/via-dirlink", "pwned"),
            lambda: sandbox.files.write("../../../../../.." + str(host_dir) + "/via-dots", "pwned", user="root"),
            lambda: sandbox.files.write(str(host_dir) + "/via-abs", "pwned", user="root"),
            lambda: sandbox.files.make_dir(str(host_dir) + "/via-mkdir", user="root"),
            lambda: sandbox.files.rename("/home/user/.bashrc", "../../../../.." + str(host_dir) + "/via-rename"),
            lambda: requests.post(
                sandbox.upload_url("../../../../.." + str(host_dir) + "/via-url", user="root"),
                files={"file": ("f", b"pwned")},
                proxies={"http": None},
                timeout=30,
            ),
        ]
        for attempt in attempts:
            try:
                attempt()
            except Exception:  # noqa: BLE001 - refusing is fine; landing on the host is not
                pass
        assert sorted(os.listdir(host_dir)) == [], f"sandbox wrote to the host: {os.listdir(host_dir)}"
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    assert path.read_text() == secret


# ---- network ------------------------------------------------------------------------------------


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"host-says-hello")

    def log_message(self, *a):
        pass


@pytest.fixture
def host_http():
    srv = ThreadingHTTPServer(("0.0.0.0", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _host_addresses():
    addrs = {"127.0.0.1"}
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
        addrs |= {a for a in out if ":" not in a}
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(addrs)


@pytest.mark.parametrize("internet", [None, False, True], ids=["default", "no-internet", "internet"])
def test_cannot_reach_host_loopback_or_addresses(sandbox_factory, server, host_http, internet):
    port = host_http
    # The host itself can reach it.
    assert http("GET", f"http://127.0.0.1:{port}/").body == b"host-says-hello"
    kw = {} if internet is None else {"allow_internet_access": internet}
    sbx = sandbox_factory(**kw)
    server_port = int(server.url.rsplit(":", 1)[1])
    targets = [f"http://{a}:{port}/" for a in _host_addresses()] + [f"http://127.0.0.1:{server_port}/health"]
    for url in targets:
        t0 = time.monotonic()
        r = sbx.commands.run(f"curl -sSf -m 5 {url}; echo \" rc=$?\"", timeout=30)
        took = time.monotonic() - t0
        assert "host-says-hello" not in r.stdout, f"{url} reachable from the sandbox"
        assert " rc=0" not in r.stdout, f"{url}: {r.stdout} {r.stderr}"
        assert took < 10, f"{url}: took {took:.1f}s (should fail fast)"
    py = (
        "import socket\n"
        f"for host in {_host_addresses()!r}:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        f"    try:\n        s.connect((host, {port})); print('CONNECTED', host)\n"
        "    except OSError as e:\n        print('refused', host, e.errno)\n"
    )
    out = run_py(sbx, py).stdout
    assert "CONNECTED" not in out, out
    if internet is False:
        ifaces = sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
        assert ifaces == ["lo"], ifaces


# ---- syscalls -----------------------------------------------------------------------------------

SYSCALL_PROBE = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
res = {}

def rc(name, r):
    res[name] = 0 if r >= 0 else ctypes.get_errno()

def sc(name, nr, *args):
    ctypes.set_errno(0)
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    rc(name, libc.syscall(ctypes.c_long(nr), *conv))

os.makedirs("/tmp/mnt-probe", exist_ok=True)
ctypes.set_errno(0); rc("mount", libc.mount(b"none", b"/tmp/mnt-probe", b"tmpfs", 0, None))
ctypes.set_errno(0); rc("unshare_user", libc.unshare(0x10000000))
ctypes.set_errno(0); rc("unshare_mount", libc.unshare(0x00020000))
ctypes.set_errno(0); rc("unshare_net", libc.unshare(0x40000000))
sc("open_tree", 428, -100, b"/", 1)          # OPEN_TREE_CLONE
sc("fsopen", 430, b"tmpfs", 0)
sc("bpf", 321, 0, 0, 0)                      # BPF_MAP_CREATE, NULL attr
sc("io_uring_setup", 425, 1, 0)
sc("keyctl", 250, 0, -1, 0)                  # KEYCTL_GET_KEYRING_ID thread keyring
sc("userfaultfd", 323, 0)
for name, fam, typ in (("af_vsock", 40, socket.SOCK_STREAM), ("af_packet", 17, socket.SOCK_RAW)):
    try:
        socket.socket(fam, typ, 0).close()
        res[name] = 0
    except OSError as e:
        res[name] = e.errno
print(json.dumps(res))
"""

MUST_BE_EPERM = ("mount", "unshare_user", "unshare_mount", "unshare_net", "open_tree", "fsopen", "bpf", "af_vsock", "af_packet")
MUST_FAIL = ("io_uring_setup", "keyctl", "userfaultfd")  # EPERM (or ENOSYS) from seccomp


@pytest.mark.parametrize("user", USERS)
def test_dangerous_syscalls_fail_with_eperm(sandbox, user):
    r = run_py(sandbox, SYSCALL_PROBE, user=user)
    res = json.loads(r.stdout)
    for name in MUST_BE_EPERM:
        assert res[name] == errno.EPERM, f"{name} as {user}: {errno.errorcode.get(res[name], res[name])} (want EPERM); all: {res}"
    for name in MUST_FAIL:
        assert res[name] in (errno.EPERM, errno.ENOSYS), f"{name} as {user}: {errno.errorcode.get(res[name], res[name])}; all: {res}"


@pytest.mark.parametrize("user", USERS)
def test_mount_and_unshare_commands_fail(sandbox, user):
    r = sandbox.commands.run("mount -t tmpfs none /mnt 2>&1; echo rc=$?", user=user)
    assert "rc=0" not in r.stdout
    assert "permission denied" in r.stdout.lower() or "not permitted" in r.stdout.lower() or "must be superuser" in r.stdout.lower(), r.stdout
    r = sandbox.commands.run("unshare -U true 2>&1; echo rc=$?", user=user)
    assert "rc=0" not in r.stdout
    assert "not permitted" in r.stdout.lower(), r.stdout
    r = sandbox.commands.run("unshare -m true 2>&1; echo rc=$?", user=user)
    assert "rc=0" not in r.stdout


INT80_PROBE = r"""
import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")   # mov eax, 20 (i386 getpid); int 0x80; ret
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
fn = ctypes.CFUNCTYPE(ctypes.c_int)(addr)
print("result=%d" % fn(), flush=True)
"""


def test_32bit_syscall_entry_is_blocked(sandbox):
    sandbox.files.write("/tmp/int80.py", INT80_PROBE)
    r = sandbox.commands.run("python3 /tmp/int80.py; echo rc=$?", timeout=30)
    out = r.stdout
    if "result=" in out:
        val = int(out.split("result=")[1].split()[0])
        assert val < 0, f"i386 getpid via int 0x80 succeeded (returned {val})"
    else:
        assert "rc=0" not in out, out  # killed (SIGSYS) is the expected outcome


@pytest.mark.parametrize("user", ("user", "root"))
def test_proc_dev_and_sys_take_no_writes(sandbox, user):
    """The read-only /proc, /dev and /sys mounts stop these writes, restored sandboxes included
    (root owns /dev's tmpfs inside, /proc/self/oom_score_adj may be raised without privilege,
    and the Landlock ruleset allows everything beneath / so that new top-level directories
    work as on E2B)."""
    probe = (
        "import errno, os, sys\n"
        "try:\n"
        "    {op}\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
        "else:\n"
        "    print('WROTE')\n"
    )
    ops = [
        "open('/proc/self/oom_score_adj', 'w').write('500')",
        "open('/dev/landlock-probe', 'w').write('x')",
        "os.mkdir('/dev/probe-dir')",
        "os.symlink('/etc', '/dev/probe-link')",
        "open('/sys/probe', 'w').write('x')",
        "open('/proc/self/comm', 'w').write('renamed')",
    ]
    for op in ops:
        r = run_py(sandbox, probe.format(op=op), user=user)
        assert r.stdout.strip() in ("EROFS", "EACCES", "EPERM"), (op, r.stdout, r.stderr)
    # The devices themselves still work (a read-only mount refuses files, not device I/O).
    r = sandbox.commands.run("echo x > /dev/null && head -c 4 /dev/urandom | wc -c && ls /dev/shm /dev/pts >/dev/null && echo ok", user=user)
    assert r.stdout == "4\nok\n"
    # New top-level directories are the sandbox's own: root may make them, as on E2B.
    if user == "root":
        top = f"/probe-{secrets.token_hex(3)}"
        r = sandbox.commands.run(f"mkdir {top} && echo in > {top}/f && cat {top}/f && rm -r {top}", user=user)
        assert r.stdout == "in\n"


@pytest.mark.parametrize("user", USERS)
def test_hardening_flags(sandbox, user, request):
    status = sandbox.commands.run("cat /proc/self/status", user=user).stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    # No no_new_privs, fresh or restored (set-uid sudo reaches the sandbox's own root, within
    # the bounding set checked below; a restore does not re-apply Landlock: docs/persistence.md).
    assert fields["NoNewPrivs"].strip() == "0", request.node.callspec.params["sandbox"]
    assert fields["Seccomp"].strip() == "2"
    cap_eff = int(fields["CapEff"].strip(), 16)
    cap_bnd = int(fields["CapBnd"].strip(), 16)
    if user == "user":
        assert cap_eff == 0, hex(cap_eff)
    assert cap_eff & ~DOCKER_DEFAULT_CAPS == 0, hex(cap_eff)
    assert cap_bnd & ~DOCKER_DEFAULT_CAPS == 0, hex(cap_bnd)


# ---- resource bombs -----------------------------------------------------------------------------


def _neighbour_and_server_answer(server, neighbour):
    t0 = time.monotonic()
    r = http("GET", server.url + "/health", timeout=10)
    assert r.status == 204
    assert neighbour.commands.run("echo neighbour-ok", timeout=30).stdout == "neighbour-ok\n"
    assert time.monotonic() - t0 < 20


def _agent_answers(sbx, cmd, expect, within=60):
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        try:
            r = sbx.commands.run(cmd, timeout=20)
            if expect in r.stdout:
                return r
            last = r
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.5)
    raise AssertionError(f"sandbox agent did not answer `{cmd}` within {within}s: {last!r}")


@pytest.mark.destructive
def test_fork_bomb_is_contained(sandbox_factory, server):
    bombed = sandbox_factory(timeout=300)
    neighbour = sandbox_factory(timeout=300)
    # `ulimit -u` is only a backstop so a missing pids limit cannot take the CI host down; it is
    # far above any sane per-sandbox pids limit.
    bombed.commands.run("ulimit -u 8192; timeout -s KILL 30 bash -c ':(){ :|:& };:'", background=True, timeout=90)
    time.sleep(4)
    # The agent answers calls that need no new process while the bomb runs.
    bombed.files.write("/tmp/during-bomb.txt", "written during the bomb", request_timeout=30)
    assert bombed.files.read("/tmp/during-bomb.txt", request_timeout=30) == "written during the bomb"
    bombed.commands.list(request_timeout=30)
    _neighbour_and_server_answer(server, neighbour)
    # `kill -1` as the default user ends the bomb (builtin: needs no fork once bash is up).
    _agent_answers(bombed, "kill -9 -1 2>/dev/null; echo alive-after-bomb", "alive-after-bomb")
    _agent_answers(bombed, "echo still-alive", "still-alive")
    _neighbour_and_server_answer(server, neighbour)
    assert bombed.kill() is True


@pytest.mark.destructive
def test_memory_bomb_is_contained(sandbox_factory, server):
    bombed = sandbox_factory(timeout=300)
    neighbour = sandbox_factory(timeout=300)
    code = (
        "blocks = []\n"
        "for i in range(1024):  # stops at 8 GiB: a backstop if no memory limit is set\n"
        "    blocks.append(b'x' * (8 << 20))\n"
        "    if i % 8 == 0:\n"
        "        print(i * 8, 'MiB', flush=True)\n"
        "print('NOT CONTAINED', flush=True)\n"
    )
    bombed.files.write("/tmp/membomb.py", code)
    t0 = time.monotonic()
    with pytest.raises(CommandExitException) as ei:
        bombed.commands.run("python3 /tmp/membomb.py", timeout=180)
    assert "NOT CONTAINED" not in ei.value.stdout
    assert ei.value.exit_code != 0
    assert time.monotonic() - t0 < 170
    _agent_answers(bombed, "echo alive-after-oom", "alive-after-oom", within=30)
    _neighbour_and_server_answer(server, neighbour)
    info = bombed.get_info()
    assert info.memory_mb > 0


# ---- sandbox vs sandbox -------------------------------------------------------------------------


def test_sandbox_cannot_see_neighbour(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    tag = secrets.token_hex(6)
    b.files.write(f"/home/user/b-secret-{tag}.txt", "B")
    b.commands.run(f"echo B > /tmp/b-secret-{tag}", user="root")
    hb = b.commands.run("sleep 4323", background=True)
    try:
        for user in USERS:
            ps = a.commands.run("ps -eo args", user=user).stdout
            assert "sleep 4323" not in ps
        found = a.commands.run(f"find / -xdev -name 'b-secret-{tag}*' 2>/dev/null; true", user="root", timeout=120).stdout
        assert found.strip() == ""
        assert not a.files.exists(f"/home/user/b-secret-{tag}.txt")
        assert not a.files.exists(f"/tmp/b-secret-{tag}")
        # a's hostname and b's are its own business, but b's files never show up under /proc/*/root.
        r = a.commands.run(f"ls /proc/*/root/tmp/b-secret-{tag} 2>/dev/null; true", user="root")
        assert r.stdout.strip() == ""
    finally:
        hb.kill()
