"""Helpers shared by the SDK conformance suites (tests/sdk/python, tests/sdk/python_old).

Standard library only: this module is imported by the current-SDK venv and the old-SDK venv
alike, so it must not depend on anything but Python itself.

- `BulkheadServer` starts a real `bulkhead serve` (or wraps an external one given by
  `BULKHEAD_TEST_URL`), waits until it can create a sandbox, and stops it.
- `http()` is a tiny urllib wrapper that never raises on HTTP error statuses.
- `HostState` snapshots what sandboxes leave on the host (processes in slot uid ranges or of the
  agent binary, mounts under the data dir, cgroups under the bulkhead parent, slot directories)
  for the leak and isolation tests.
"""

from __future__ import annotations

import ctypes
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]

# A sandbox id in E2B's format (and Bulkhead's): lowercase letters and digits.
TEMPLATE = os.environ.get("BULKHEAD_TEST_TEMPLATE", "base")
# The `--sandbox-domain` of the servers the tests start (`.test`: reserved, never resolves).
TEST_SANDBOX_DOMAIN = "sandboxes.bulkhead.test"
SLOT_UID_MIN = int(os.environ.get("BULKHEAD_SLOT_UID_MIN", "1000000"))
CGROUP_PARENT = os.environ.get("BULKHEAD_CGROUP_PARENT", "bulkhead")
AGENT_NAME = "bulkhead-agent"


def generate_api_key() -> str:
    """A key in E2B's format: `e2b_` + 40 lowercase hex characters."""
    return "e2b_" + secrets.token_hex(20)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HttpResult:
    status: int
    headers: Dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body.decode() or "null")

    def header(self, name: str) -> Optional[str]:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None


# Never through a proxy from the environment: the server under test is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    method: str,
    url: str,
    body=None,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 30,
) -> HttpResult:
    """One HTTP request; returns status, headers and body whatever the status."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        else:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return HttpResult(r.status, dict(r.headers.items()), r.read())
    except urllib.error.HTTPError as e:
        return HttpResult(e.code, dict(e.headers.items()), e.read())


def _set_pdeathsig():
    """Runs in the child before exec: the server gets SIGTERM if the test runner dies, so a
    crashed or killed pytest never leaves a server behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class ServerStartError(RuntimeError):
    pass


class BulkheadServer:
    """A `bulkhead serve` under test: either started here (`owned`) or external."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        data_dir: Optional[Path] = None,
        tmp_root: Optional[Path] = None,
        log_path: Optional[Path] = None,
        proc: Optional[subprocess.Popen] = None,
        pid: Optional[int] = None,
        argv: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
    ):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.data_dir = data_dir
        self.tmp_root = tmp_root
        self.log_path = log_path
        self.proc = proc
        self._pid = pid
        self._argv = argv
        self._env = env
        self._log_file = None
        self.cgroups_before: set = set()
        # The `--sandbox-domain` the server answers in create/connect (an external server's
        # from BULKHEAD_TEST_SANDBOX_DOMAIN).
        self.sandbox_domain: Optional[str] = os.environ.get("BULKHEAD_TEST_SANDBOX_DOMAIN")

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_env(cls, extra_args: Optional[List[str]] = None) -> "BulkheadServer":
        """An external server (`BULKHEAD_TEST_URL`) or a freshly started one (with
        `extra_args` added to `bulkhead serve`)."""
        url = os.environ.get("BULKHEAD_TEST_URL")
        if url:
            key = os.environ.get("BULKHEAD_TEST_API_KEY") or os.environ.get("E2B_API_KEY")
            if not key:
                raise ServerStartError("BULKHEAD_TEST_URL is set but BULKHEAD_TEST_API_KEY is not")
            data_dir = os.environ.get("BULKHEAD_TEST_DATA_DIR")
            pid = os.environ.get("BULKHEAD_TEST_SERVER_PID")
            srv = cls(
                url,
                key,
                data_dir=Path(data_dir) if data_dir else None,
                pid=int(pid) if pid else None,
            )
            srv.wait_ready(timeout=float(os.environ.get("BULKHEAD_STARTUP_TIMEOUT", "120")))
            return srv
        return cls.start(extra_args)

    @classmethod
    def start(
        cls,
        extra_args: Optional[List[str]] = None,
        subcommand: str = "serve",
        extra_env: Optional[Dict[str, str]] = None,
    ) -> "BulkheadServer":
        """`bulkhead serve` (or another role serving the REST API, e.g. `api`) on a free port
        with a data dir of its own; `extra_env` is added to its environment."""
        binary = Path(os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead")))
        if not binary.is_absolute():
            binary = (REPO / binary).resolve()
        if not binary.exists():
            raise ServerStartError(
                f"bulkhead binary not found at {binary}: run `cargo build --workspace` or set BULKHEAD_BIN"
            )
        image_cache = Path(os.environ.get("BULKHEAD_IMAGE_CACHE", "/var/cache/bulkhead/images"))
        image_cache.mkdir(parents=True, exist_ok=True)
        # On disk (not tmpfs) and with a short, neutral path: it shows up in sandboxes' mountinfo.
        base_tmp = os.environ.get("BULKHEAD_TEST_TMPDIR", "/var/tmp")
        tmp_root = Path(tempfile.mkdtemp(prefix="bulkhead-test-", dir=base_tmp))
        # Sandbox uids must traverse to their slot dirs (the jail refuses a 0700 ancestor).
        tmp_root.chmod(0o711)
        data_dir = tmp_root / "data"
        data_dir.mkdir()
        log_path = tmp_root / "server.log"
        port = free_port()
        key = generate_api_key()
        argv = [
            str(binary),
            subcommand,
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
            "--image-cache",
            str(image_cache),
            "--log-level",
            os.environ.get("BULKHEAD_TEST_LOG_LEVEL", "info"),
            *(extra_args or []),
        ]
        if not any(a.startswith("--sandbox-domain") for a in (extra_args or [])):
            # A name that never resolves: the SDKs reach sandboxes through E2B_SANDBOX_URL, and
            # the host scheme is tested by sending the Host header to the server itself.
            argv += ["--sandbox-domain", TEST_SANDBOX_DOMAIN]
        if not any(a.startswith("--pool") for a in (extra_args or [])):
            # A fixed warm pool: the leak test compares the host's sandbox resources before and
            # after 200 creates, which an adaptive pool grows (by design) for minutes.
            argv += ["--pool-size", "2"]
        env = dict(os.environ)
        env["BULKHEAD_API_KEY"] = key
        # The server must not pick up a developer's own settings.
        for k in ("BULKHEAD_DATA_DIR", "BULKHEAD_DATABASE_URL", "BULKHEAD_LISTEN"):
            env.pop(k, None)
        env.update(extra_env or {})
        srv = cls(
            f"http://127.0.0.1:{port}",
            key,
            data_dir=data_dir,
            tmp_root=tmp_root,
            log_path=log_path,
            argv=argv,
            env=env,
        )
        # Cgroups that existed before this server (a crashed earlier run, a colleague's server):
        # the leak test only blames the ones that appear after.
        srv.cgroups_before = set(cgroup_dirs())
        domains = [a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv) if a.startswith("--sandbox-domain")]
        srv.sandbox_domain = domains[-1]
        srv._spawn()
        srv.wait_ready(timeout=float(os.environ.get("BULKHEAD_STARTUP_TIMEOUT", "1200")))
        return srv

    def _spawn(self):
        assert self._argv and self.log_path
        self._log_file = open(self.log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(
            self._argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
            preexec_fn=_set_pdeathsig,
        )

    # ---- state --------------------------------------------------------------------------

    @property
    def owned(self) -> bool:
        return self._argv is not None

    @property
    def pid(self) -> Optional[int]:
        if self.proc is not None:
            return self.proc.pid
        return self._pid

    @property
    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return True

    def api_headers(self) -> Dict[str, str]:
        return {"X-API-Key": self.api_key}

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def log_since(self, offset: int, max_lines: int = 200) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        lines = text.splitlines()
        if len(lines) > max_lines:
            lines = [f"... ({len(lines) - max_lines} earlier lines omitted)"] + lines[-max_lines:]
        return "\n".join(lines)

    def log_tail(self, max_lines: int = 200) -> str:
        return self.log_since(0, max_lines)

    # ---- lifecycle ----------------------------------------------------------------------

    def wait_ready(self, timeout: float):
        """Wait for `GET /health` → 204, then for a sandbox to be created and killed (the first
        start may build the base template; a server that cannot create sandboxes is not ready)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerStartError(
                    f"bulkhead serve exited with {self.proc.returncode} during startup:\n{self.log_tail(80)}"
                )
            try:
                r = http("GET", self.url + "/health", timeout=5)
                if r.status == 204:
                    break
                last = f"/health answered {r.status}"
            except OSError as e:
                last = str(e)
            time.sleep(0.25)
        else:
            raise ServerStartError(f"server at {self.url} not healthy after {timeout}s ({last}):\n{self.log_tail(80)}")
        # A real create proves the template and the driver work.
        while True:
            r = http(
                "POST",
                self.url + "/v2/sandboxes",
                {"templateID": TEMPLATE, "timeout": 60, "metadata": {"bulkhead-test": "warmup"}},
                headers=self.api_headers(),
                timeout=max(5.0, deadline - time.monotonic()),
            )
            if r.status == 201:
                sid = r.json()["sandboxID"]
                http("DELETE", f"{self.url}/sandboxes/{sid}", headers=self.api_headers())
                return
            if time.monotonic() > deadline or r.status in (400, 401, 404):
                raise ServerStartError(
                    f"server at {self.url} cannot create a '{TEMPLATE}' sandbox: {r.status} {r.body[:500]!r}\n{self.log_tail(80)}"
                )
            time.sleep(1)

    def stop(self, timeout: float = 60) -> Optional[int]:
        """SIGTERM, wait, SIGKILL. Returns the exit status (None for an external server)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def restart(self):
        """Start the same server again (same port, data dir and key)."""
        assert self.owned, "cannot restart an external server"
        self.stop()
        self._spawn()
        self.wait_ready(timeout=float(os.environ.get("BULKHEAD_STARTUP_TIMEOUT", "1200")))

    def ensure_running(self):
        if self.owned and not self.running:
            self.restart()

    def kill_all_sandboxes(self):
        """Kill every sandbox the server lists (raw API, both states)."""
        token = None
        ids = []
        for _ in range(100):
            q = "?limit=100" + (f"&nextToken={urllib.parse.quote(token)}" if token else "")
            r = http("GET", f"{self.url}/v2/sandboxes{q}", headers=self.api_headers())
            if r.status != 200:
                break
            ids += [s["sandboxID"] for s in r.json()]
            token = r.header("x-next-token")
            if not token:
                break
        for sid in ids:
            http("DELETE", f"{self.url}/sandboxes/{sid}", headers=self.api_headers())
        return ids

    def cleanup_files(self):
        """Remove the temp dir: unmount anything left under it first, so removal never walks
        into a mount (e.g. the image cache bind-mounted somewhere)."""
        if not self.tmp_root or not self.tmp_root.exists():
            return
        for mp in sorted(mounts_under(self.tmp_root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if mounts_under(self.tmp_root):
            return  # refuse to rm -rf across a mount
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.tmp_root)], stderr=subprocess.DEVNULL)


# ---- host inspection ------------------------------------------------------------------------


def _unescape_mountinfo(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mountinfo() -> List[Tuple[str, str]]:
    """(mount point, fs type) of every mount in this process's mount namespace."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            res.append((_unescape_mountinfo(parts[4]), parts[sep + 1]))
    return res


def mounts_under(root: Path) -> List[str]:
    prefix = str(root).rstrip("/") + "/"
    return [mp for mp, _ in mountinfo() if mp.startswith(prefix) or mp == str(root)]


def cgroup_roots() -> List[Path]:
    return [Path(mp) for mp, fs in mountinfo() if fs in ("cgroup", "cgroup2")]


def cgroup_dirs(parent: str = CGROUP_PARENT) -> List[str]:
    """Every cgroup directory below `<each cgroup mount>/<parent>/` (not the parent itself)."""
    found = []
    for root in cgroup_roots():
        base = root / parent
        if not base.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(base):
            for d in dirnames:
                found.append(os.path.join(dirpath, d))
    return sorted(found)


def cgroup_dirs_with_procs(parent: str = CGROUP_PARENT) -> List[str]:
    res = []
    for d in cgroup_dirs(parent):
        try:
            if Path(d, "cgroup.procs").read_text().strip():
                res.append(d)
        except OSError:
            pass
    return res


@dataclass
class Proc:
    pid: int
    ppid: int
    uid: int
    comm: str
    cmdline: str
    cgroup: str = ""
    state: str = ""

    def describe(self) -> str:
        return f"pid={self.pid} ppid={self.ppid} uid={self.uid} comm={self.comm!r} cmd={self.cmdline[:120]!r}"


def processes() -> List[Proc]:
    res = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            uid = ppid = -1
            comm = state = ""
            for line in status.splitlines():
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith("PPid:"):
                    ppid = int(line.split()[1])
                elif line.startswith("State:"):
                    state = line.split()[1]
                elif line.startswith("Name:"):
                    comm = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            try:
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                cgroup = ""
            res.append(Proc(pid, ppid, uid, comm, cmdline, cgroup, state))
        except (OSError, ValueError, IndexError):
            continue
    return res


def _is_server(p: Proc) -> bool:
    argv = p.cmdline.split()
    return bool(argv) and argv[0].endswith("bulkhead") and "serve" in argv[1:3]


def sandbox_processes(own_server_pid: Optional[int] = None) -> List[Proc]:
    """Processes that belong to sandboxes: a uid in the slot ranges, or the agent binary.
    Descendants of *other* running `bulkhead serve` processes (a colleague's dev server on the
    same machine) are left out; in CI there are none."""
    procs = processes()
    by_pid = {p.pid: p for p in procs}
    foreign = {p.pid for p in procs if _is_server(p) and p.pid != own_server_pid}

    def under_foreign(p: Proc) -> bool:
        seen = 0
        cur = p
        while cur is not None and seen < 64:
            if cur.pid in foreign:
                return True
            cur = by_pid.get(cur.ppid)
            seen += 1
        return False

    res = []
    for p in procs:
        if p.pid == os.getpid():
            continue
        # A dead sandbox init whose server has gone (re-adopted after a restart, or an earlier
        # run) is reparented to the host's pid 1, and reaping it is that init's job: it holds
        # no memory, mounts or cgroup. Zombies still parented by a server are leaks.
        if p.state == "Z" and p.ppid == 1:
            continue
        is_sandbox = p.uid >= SLOT_UID_MIN or p.comm == AGENT_NAME or AGENT_NAME in p.cmdline.split(" ")[0]
        if is_sandbox and not under_foreign(p):
            res.append(p)
    return res


def nonempty_slot_dirs(data_dir: Path) -> List[str]:
    slots = data_dir / "jail" / "s"
    if not slots.is_dir():
        return []
    res = []
    for d in sorted(slots.iterdir()):
        try:
            if d.is_dir() and any(d.iterdir()):
                res.append(str(d))
        except OSError:
            res.append(str(d))
    return res


def leftover_mounts(data_dir: Path) -> List[str]:
    """Mounts under the data dir other than the reusable idmapped lower layers (jail/l/…)."""
    lower = str(data_dir / "jail" / "l") + "/"
    return [mp for mp in mounts_under(data_dir) if not (mp + "/").startswith(lower)]


@dataclass
class HostState:
    procs: List[Proc] = field(default_factory=list)
    mounts: List[str] = field(default_factory=list)
    cgroups: List[str] = field(default_factory=list)
    slots: List[str] = field(default_factory=list)

    @classmethod
    def capture(cls, data_dir: Optional[Path], server_pid: Optional[int]) -> "HostState":
        return cls(
            procs=sandbox_processes(server_pid),
            mounts=leftover_mounts(data_dir) if data_dir else [],
            cgroups=cgroup_dirs(),
            slots=nonempty_slot_dirs(data_dir) if data_dir else [],
        )

    def counts(self) -> Dict[str, int]:
        return {
            "processes": len(self.procs),
            "mounts": len(self.mounts),
            "cgroups": len(self.cgroups),
            "slot_dirs": len(self.slots),
        }

    def describe(self, limit: int = 30) -> str:
        out = [f"counts: {self.counts()}"]
        out += ["  proc " + p.describe() for p in self.procs[:limit]]
        out += ["  mount " + m for m in self.mounts[:limit]]
        out += ["  cgroup " + c for c in self.cgroups[:limit]]
        out += ["  slot " + s for s in self.slots[:limit]]
        return "\n".join(out)


def kill_quietly(sandboxes) -> None:
    """Teardown kill of SDK sandboxes; one a test already killed (or the server lost) must not
    fail the teardown or stop the others from being killed."""
    for sbx in sandboxes:
        try:
            sbx.kill()
        except Exception:
            pass



ENV_KEYS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_VOLUME_API_URL")


@contextlib.contextmanager
def own_server(extra_args: List[str]):
    """A server of the test's own (`BulkheadServer.start(extra_args)`) with the SDKs' environment
    pointed at it. Tests add the keys of teams they make to `srv.team_keys`; on exit every
    sandbox of every one of those teams is killed through the API before the server stops, and
    the environment is restored."""
    srv = BulkheadServer.start(extra_args=extra_args)
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update(
        E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=srv.api_key, E2B_VOLUME_API_URL=srv.url
    )
    srv.team_keys = [srv.api_key]
    try:
        yield srv
    finally:
        srv.ensure_running()
        for key in srv.team_keys:
            r = http("GET", f"{srv.url}/v2/sandboxes?state=running&state=paused&limit=100", headers={"X-API-Key": key})
            for sbx in r.json() if r.status == 200 else []:
                http("DELETE", f"{srv.url}/sandboxes/{sbx['sandboxID']}", headers={"X-API-Key": key})
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.stop()
        srv.cleanup_files()


def wait_until(pred, timeout: float, interval: float = 0.25):
    """Poll `pred()` until truthy; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)
