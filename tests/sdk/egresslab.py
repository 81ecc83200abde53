"""A local upstream world for the egress tests (standard library + the `ip` and `openssl` tools).

- `TestPki` makes a throwaway CA and one leaf certificate for the test names. The CA goes to the
  server as `--egress-upstream-ca` (the proxy trusts it for upstream TLS when it injects headers);
  sandboxes never see it.
- `serve_args()` are the `bulkhead serve` flags the network tests need: the TEST-ONLY resolver
  override that maps the test names to the upstream host, the upstream CA, and the host's CA
  bundle for sandboxes (this machine's outbound TLS is re-signed by an inspecting proxy).
- `UpstreamLab` creates a network namespace `bh-up-<pid>` joined to the host by a veth pair in
  `LAB_NET`.0/24 (host .1, namespace .10) and runs an HTTP (80) and an HTTPS (443) server there
  that answer every request with its method, path and header names (values hashed) as JSON and
  log the full requests on the host side (or, under `/files/`, serve static files from a
  directory the test fills, e.g. a package index). `close()` kills the
  servers and deletes the namespace (and with it the veth pair).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

# A documentation range (TEST-NET-2) by default. Not TEST-NET-3: on some CI machines public
# names resolve into 203.0.113.0/24 (a TLS-inspecting gateway), and a local route for that
# subnet would swallow the real package-registry traffic.
LAB_NET = os.environ.get("BULKHEAD_TEST_LAB_NET", "198.51.100")
UPSTREAM_IP = f"{LAB_NET}.10"
HOST_SIDE_IP = f"{LAB_NET}.1"
# Names the resolver override points at the upstream; the leaf certificate covers them all.
TEST_NAMES = ["api.allowed.test", "x.wild.test", "y.wild.test", "denied.test", "inject.allowed.test"]


def _run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


def missing_tools() -> Optional[str]:
    for tool in ("ip", "openssl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    return None


class TestPki:
    """CA + leaf for TEST_NAMES, in `dir` (kept until `cleanup`)."""

    __test__ = False  # not a pytest class

    def __init__(self, dir: Optional[Path] = None):
        self.dir = Path(dir or tempfile.mkdtemp(prefix="bh-egress-pki-", dir="/var/tmp"))
        self.ca_cert = self.dir / "ca.pem"
        self.ca_key = self.dir / "ca.key"
        self.leaf_cert = self.dir / "leaf.pem"
        self.leaf_key = self.dir / "leaf.key"
        if not self.leaf_cert.exists():
            self._make()

    def _make(self):
        d = self.dir
        _run(
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(self.ca_key), "-out", str(self.ca_cert), "-days", "2",
            "-subj", "/CN=Bulkhead egress test upstream CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )
        csr = d / "leaf.csr"
        _run(
            "openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.leaf_key), "-out", str(csr), "-subj", "/CN=api.allowed.test",
        )
        ext = d / "leaf.ext"
        sans = ",".join(f"DNS:{n}" for n in TEST_NAMES)
        ext.write_text(
            f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        )
        _run(
            "openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey",
            str(self.ca_key), "-CAcreateserial", "-out", str(self.leaf_cert), "-days", "2",
            "-extfile", str(ext),
        )

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def serve_args(pki: TestPki, sandbox_ca_bundle: str = "/etc/ssl/certs/ca-certificates.crt") -> List[str]:
    args = ["--egress-upstream-ca", str(pki.ca_cert)]
    for n in TEST_NAMES:
        args += ["--egress-resolve", f"{n}={UPSTREAM_IP}"]
    if Path(sandbox_ca_bundle).is_file():
        args += ["--sandbox-ca-bundle", sandbox_ca_bundle]
    return args


ECHO_SERVER = r'''
import hashlib, json, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = open(sys.argv[3], "a", buffering=1)
LOCK = threading.Lock()

FILES = sys.argv[4] if len(sys.argv) > 4 else ""

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _file(self):
        # /files/<rel>: static files from the lab's files dir (a package index, say); a
        # directory answers with its index.html.
        import os.path
        rel = self.path.split("?", 1)[0][len("/files/"):]
        p = os.path.realpath(os.path.join(FILES, rel))
        if os.path.isdir(p):
            p = os.path.join(p, "index.html")
        if not FILES or not p.startswith(os.path.realpath(FILES) + "/") or not os.path.isfile(p):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = open(p, "rb").read()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if p.endswith(".html") else "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        seen = {
            "method": self.command, "path": self.path, "tls": isinstance(self.connection, ssl.SSLSocket),
            "peer": self.client_address[0], "headers": [[k, v] for k, v in self.headers.items()],
            "body_len": len(body),
        }
        with LOCK:  # the full request (values included) only goes to the host-side log
            LOG.write(json.dumps(seen) + "\n")
        if self.path.startswith("/files/") and self.command in ("GET", "HEAD"):
            return self._file()
        # The answer carries header values only as hashes: a sandbox must never get a secret
        # back through the echo.
        seen["headers"] = [[k, hashlib.sha256(v.encode()).hexdigest()] for k, v in self.headers.items()]
        out = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = do_HEAD = _answer
    def log_message(self, *a):
        pass

cert, key = sys.argv[1], sys.argv[2]
plain = ThreadingHTTPServer(("0.0.0.0", 80), H)
tls = ThreadingHTTPServer(("0.0.0.0", 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
for s in (plain, tls):
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
'''


class UpstreamLab:
    """The namespace with the echo servers. Use as a context manager or call `close()`."""

    def __init__(self, pki: TestPki, files: Optional[Path] = None):
        self.pki = pki
        # Served under /files/ by both servers (e.g. a PEP 503 package index).
        self.files = files
        pid = os.getpid()
        self.netns = f"bh-up-{pid}"
        self.veth_host = f"bhu{pid % 10**7}h"
        self.veth_ns = f"bhu{pid % 10**7}n"
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0.0
        self._script = pki.dir / "echo_server.py"
        self.log = pki.dir / f"requests-{pid}.jsonl"

    def start(self) -> "UpstreamLab":
        self.close()  # leftovers of a crashed run with the same pid
        for name in ("pypi.org", "registry.npmjs.org"):
            try:
                addrs = {a[4][0] for a in socket.getaddrinfo(name, 443, socket.AF_INET)}
            except OSError:
                continue
            clash = [a for a in addrs if a.startswith(LAB_NET + ".")]
            if clash:
                raise RuntimeError(
                    f"the lab subnet {LAB_NET}.0/24 holds {name}'s address {clash}: set BULKHEAD_TEST_LAB_NET"
                )
        try:
            _run("ip", "netns", "add", self.netns)
            _run("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns)
            _run("ip", "link", "set", self.veth_ns, "netns", self.netns)
            _run("ip", "addr", "add", f"{HOST_SIDE_IP}/24", "dev", self.veth_host)
            _run("ip", "link", "set", self.veth_host, "up")
            ns = ["ip", "netns", "exec", self.netns]
            _run(*ns, "ip", "addr", "add", f"{UPSTREAM_IP}/24", "dev", self.veth_ns)
            _run(*ns, "ip", "link", "set", self.veth_ns, "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            self._script.write_text(ECHO_SERVER)
            self.proc = subprocess.Popen(
                [*ns, sys.executable, str(self._script), str(self.pki.leaf_cert), str(self.pki.leaf_key), str(self.log),
                 *([str(self.files)] if self.files else [])],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            )
            line = self.proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"echo server did not start: {line!r} {self.proc.stderr.read()[:2000]}")
            self._wait_reachable()
            self.started = time.monotonic()
        except Exception:
            self.close()
            raise
        return self

    def _wait_reachable(self):
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((UPSTREAM_IP, 80), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def host_get(self, name: str, tls: bool, path: str = "/") -> dict:
        """A request from the host straight to the upstream (the test's own baseline)."""
        import http.client
        import ssl

        if tls:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
            conn = http.client.HTTPSConnection(UPSTREAM_IP, 443, context=ctx, timeout=5)
            # SNI and certificate check for the name, connection to the lab address.
            conn.sock = ctx.wrap_socket(socket.create_connection((UPSTREAM_IP, 443), timeout=5), server_hostname=name)
        else:
            conn = http.client.HTTPConnection(UPSTREAM_IP, 80, timeout=5)
        conn.request("GET", path, headers={"Host": name})
        return json.loads(conn.getresponse().read())

    def requests(self) -> List[dict]:
        """Every request the upstream has received (full header values), oldest first."""
        if not self.log.exists():
            return []
        return [json.loads(l) for l in self.log.read_text().splitlines() if l.strip()]

    def counters(self) -> dict:
        """Kernel counters of the upstream namespace (`/proc/net/snmp`): did ICMP or UDP arrive?"""
        text = _run("ip", "netns", "exec", self.netns, "cat", "/proc/net/snmp").stdout
        out = {}
        lines = text.splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            proto, names = head.split(":", 1)
            for k, v in zip(names.split(), vals.split(":", 1)[1].split()):
                out[f"{proto}.{k}"] = int(v)
        return out

    def close(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
            self.proc = None
        # Deleting the namespace destroys its veth end and with it the pair.
        _run("ip", "netns", "del", self.netns, check=False)
        _run("ip", "link", "del", self.veth_host, check=False)

    def exists(self) -> bool:
        ns = _run("ip", "netns", "list", check=False).stdout
        link = _run("ip", "link", "show", self.veth_host, check=False).returncode == 0
        return self.netns in ns.split() or link

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
