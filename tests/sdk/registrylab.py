"""A real OCI registry on loopback for the template tests, and images the tests build themselves.

`Registry` runs Debian's `docker-registry` (CNCF distribution) on 127.0.0.1, a free port, plain
HTTP, storage in a temp dir under /var/tmp, optionally with htpasswd basic auth (the same
`tester` account as crates/images/tests/it/registry.rs). `Registry.push` uploads an image over
the registry's HTTP API (blobs, then the manifest), as `docker push` does.

`tiny_rootfs()` is a small glibc tree made of this host's own binaries and the libraries `ldd`
names for them (bash, coreutils, tar, setsid…): enough for Bulkhead's agent and E2B's command
and build-step shell, a few MB, byte-for-byte reproducible so its digest (and the server's image
cache entry) is the same on every run.

Also a command line for the JS suite, which shares this helper:
  python3 registrylab.py serve [--auth]   prints {"port": N} and pushes on request lines
  (JSON on stdin: {"push": "repo:tag", "env": {...}, "files": {...}, "user": ..., "workdir": ...}
  answered with {"digest": ...}); stops the registry when stdin closes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Tuple

REGISTRY_BIN = "/usr/bin/docker-registry"
# `tester:bcrypt("bulkhead-pw")`, cost 4 (as in crates/images/tests/it/registry.rs).
HTPASSWD = "tester:$2b$04$NGUCcI/7rBqGwnXyGTNgyODMc8mWk8IQ0DRMhc/8Evp6YnbrfRpoO\n"
USER = "tester"
PASSWORD = "bulkhead-pw"

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
MTIME = 1_700_000_000

# Host programs in the tiny tree: what E2B's shell, the build steps' scripts (COPY unpacks with
# tar and cp, WORKDIR runs mkdir/chown, start commands use setsid) and the tests call.
TINY_PROGRAMS = [
    "bash", "sh", "cat", "ls", "mkdir", "chown", "chmod", "cp", "mv", "rm", "ln", "touch", "tar",
    "mktemp", "basename", "dirname", "id", "whoami", "env", "printenv", "sleep", "setsid", "grep",
    "head", "stat", "readlink", "true", "false", "uname", "sed", "gzip", "useradd",
]


def missing() -> Optional[str]:
    """Why the registry tests cannot run here, or None."""
    if not os.path.exists(REGISTRY_BIN):
        return f"{REGISTRY_BIN} is not installed (apt-get install docker-registry; scripts/test.sh installs it)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, basic_auth: bool = False):
        self.dir = tempfile.mkdtemp(prefix="bulkhead-registry-", dir="/var/tmp")
        self.port = free_port()
        self.basic_auth = basic_auth
        auth = ""
        if basic_auth:
            htpasswd = os.path.join(self.dir, "htpasswd")
            with open(htpasswd, "w") as f:
                f.write(HTPASSWD)
            auth = f"auth:\n  htpasswd:\n    realm: bulkhead-test\n    path: {htpasswd}\n"
        config = os.path.join(self.dir, "config.yml")
        with open(config, "w") as f:
            f.write(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {self.dir}/data\nhttp:\n  addr: 127.0.0.1:{self.port}\n{auth}"
            )
        self.log = open(os.path.join(self.dir, "registry.log"), "ab")
        self.proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", config], stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log
        )
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {open(self.log.name).read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("docker-registry did not start")
                time.sleep(0.1)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- pushing ----------------------------------------------------------------------------

    def _request(self, method: str, url: str, data: Optional[bytes] = None, headers=None):
        headers = dict(headers or {})
        if self.basic_auth:
            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        if not url.startswith("http"):
            url = f"http://{self.host}{url}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()

    def _blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _, headers, _ = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        loc = headers["Location"]
        if loc.startswith("/"):
            loc = f"http://{self.host}{loc}"
        sep = "&" if "?" in loc else "?"
        self._request(
            "PUT", f"{loc}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"}
        )
        return digest

    def push(
        self,
        reference: str,
        layers: List[bytes],
        env: Optional[Dict[str, str]] = None,
        user: Optional[str] = None,
        workdir: Optional[str] = None,
    ) -> str:
        """Pushes uncompressed tar `layers` as `repo:tag` with a config carrying env, user and
        workdir; returns the manifest digest."""
        repo, tag = reference.rsplit(":", 1)
        gz = [gzip.compress(l, compresslevel=1, mtime=0) for l in layers]
        cfg: Dict[str, object] = {"Env": [f"{k}={v}" for k, v in (env or {}).items()]}
        if user:
            cfg["User"] = user
        if workdir:
            cfg["WorkingDir"] = workdir
        config = json.dumps(
            {
                "architecture": "amd64" if os.uname().machine == "x86_64" else "arm64",
                "os": "linux",
                "config": cfg,
                "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]},
            },
            sort_keys=True,
        ).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": self._blob(repo, config), "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": self._blob(repo, g), "size": len(g)} for g in gz],
        }
        body = json.dumps(manifest, sort_keys=True).encode()
        self._request("PUT", f"/v2/{repo}/manifests/{tag}", body, {"Content-Type": MANIFEST_TYPE})
        return "sha256:" + hashlib.sha256(body).hexdigest()


# ---- image trees ------------------------------------------------------------------------------


class TreeTar:
    """A reproducible tar built from host paths (symlinks along each path kept as symlinks)."""

    def __init__(self):
        self.dirs: set = set()
        self.links: Dict[str, str] = {}
        self.files: Dict[str, Tuple[bytes, int]] = {}

    def _parents(self, path: str):
        p = os.path.dirname(path)
        while p not in ("/", ""):
            self.dirs.add(p)
            p = os.path.dirname(p)

    def add_host(self, path: str, depth: int = 0):
        if depth > 20:
            raise RuntimeError(f"symlink loop at {path}")
        parts = path.strip("/").split("/")
        cur = ""
        for i, part in enumerate(parts):
            cur = f"{cur}/{part}"
            if os.path.islink(cur):
                target = os.readlink(cur)
                self._parents(cur)
                self.links[cur] = target
                resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
                rest = "/".join(parts[i + 1 :])
                return self.add_host(resolved + (f"/{rest}" if rest else ""), depth + 1)
        self._parents(cur)
        with open(cur, "rb") as f:
            self.files[cur] = (f.read(), os.stat(cur).st_mode & 0o7777)

    def add_file(self, path: str, data: bytes, mode: int = 0o644):
        self._parents(path)
        self.files[path] = (data, mode)

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
            def info(name, kind, mode):
                ti = tarfile.TarInfo(name.lstrip("/"))
                ti.type, ti.mode, ti.mtime, ti.uid, ti.gid = kind, mode, MTIME, 0, 0
                return ti
            for d in sorted(self.dirs - set(self.links)):
                t.addfile(info(d, tarfile.DIRTYPE, 0o755))
            for l, target in sorted(self.links.items()):
                ti = info(l, tarfile.SYMTYPE, 0o777)
                ti.linkname = target
                t.addfile(ti)
            for p, (data, mode) in sorted(self.files.items()):
                ti = info(p, tarfile.REGTYPE, mode)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        return buf.getvalue()


def _libraries(binary: str) -> List[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            p = line.split("=>", 1)[1].split("(")[0].strip()
        else:
            p = line.split("(")[0].strip()
        if p.startswith("/"):
            libs.append(p)
    return libs


def tiny_rootfs(extra_files: Optional[Dict[str, str]] = None, node_user: bool = False) -> bytes:
    """An uncompressed tar of the tiny glibc tree (see the module doc), plus `extra_files`.
    With `node_user`, uid 1000 belongs to `node` (as in the Node images), so the server cannot
    add E2B's `user` with that uid and has to run `useradd` in the image."""
    t = TreeTar()
    binaries = [shutil.which(p) for p in TINY_PROGRAMS]
    # The loader and the libraries the agent binary links (libgcc_s, libm, libc).
    for lib in ("libgcc_s.so.1", "libm.so.6", "libc.so.6"):
        for d in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu"):
            if os.path.exists(f"{d}/{lib}"):
                t.add_host(f"{d}/{lib}")
    for b in binaries:
        if b is None:
            continue
        # As /bin/NAME (merged /usr keeps /bin a symlink to usr/bin, as on Debian).
        t.add_host(f"/bin/{os.path.basename(b)}" if os.path.exists(f"/bin/{os.path.basename(b)}") else b)
        for lib in _libraries(b):
            t.add_host(lib)
    # Accounts: root only; the server adds E2B's `user` when it prepares the pulled tree.
    node = node_user
    t.add_file("/etc/passwd", b"root:x:0:0:root:/root:/bin/bash\n" + (b"node:x:1000:1000::/home/node:/bin/bash\n" if node else b""))
    t.add_file("/etc/group", b"root:x:0:\nusers:x:100:\n" + (b"node:x:1000:\n" if node else b""))
    t.add_file("/etc/shadow", b"root:*:19000:0:99999:7:::\n" + (b"node:*:19000:0:99999:7:::\n" if node else b""), 0o640)
    if os.path.exists("/etc/login.defs"):  # useradd's settings (UID_MIN…)
        t.add_host("/etc/login.defs")
    for p, body in (extra_files or {}).items():
        t.add_file(p, body.encode())
    return t.tar()


def file_layer(files: Dict[str, str]) -> bytes:
    t = TreeTar()
    for p, body in files.items():
        t.add_file(p, body.encode())
    return t.tar()


def _serve(argv: List[str]):
    reg = Registry(basic_auth="--auth" in argv)
    try:
        print(json.dumps({"port": reg.port}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            req = json.loads(line)
            layers = [tiny_rootfs()]
            if req.get("files"):
                layers.append(file_layer(req["files"]))
            digest = reg.push(req["push"], layers, env=req.get("env"), user=req.get("user"), workdir=req.get("workdir"))
            print(json.dumps({"digest": digest}), flush=True)
    finally:
        reg.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
