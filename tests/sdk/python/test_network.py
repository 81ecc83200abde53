"""Zero-trust networking, checked end to end with the official SDK against a real server.

Upstreams are local: a network namespace `bh-up-<pid>` (see `egresslab`) holds HTTP and HTTPS
echo servers at egresslab.UPSTREAM_IP; the server's TEST-ONLY resolver override maps the test names there.
The production deny set is not weakened: the host's own addresses stay denied.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import pytest
from e2b import CommandExitException, Sandbox, Secret

import egresslab
from bulkhead_testlib import REPO, TEMPLATE, http

FAST = 2.0  # seconds: a denied attempt must fail at least this fast


def sh(sbx, cmd: str, user: str = "user", timeout: float = 120):
    """Run a shell command; returns (exit_code, stdout, stderr, seconds) and never raises on exit."""
    t = time.monotonic()
    try:
        r = sbx.commands.run(cmd, user=user, timeout=timeout)
    except CommandExitException as e:
        r = e
    return r.exit_code, r.stdout, r.stderr, time.monotonic() - t


def run_py(sbx, code: str, *args: str, user: str = "user", timeout: float = 120):
    path = f"/tmp/probe-{secrets.token_hex(4)}.py"
    sbx.files.write(path, code, user=user)
    argv = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
    return sh(sbx, f"python3 {path} {argv}", user=user, timeout=timeout)


def host_addresses():
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    v4, v6 = [], []
    for iface in json.loads(out):
        for a in iface.get("addr_info", []):
            if a.get("scope") != "global":
                continue
            (v4 if a["family"] == "inet" else v6).append(a["local"])
    return v4, v6


# Tries every way out; prints [[kind, target, port, result, seconds], ...].
PROBE = r"""
import json, socket, sys, time
out = []
for kind, host, port in json.loads(sys.argv[1]):
    t = time.monotonic()
    try:
        if kind == "tcp":
            socket.create_connection((host, port), timeout=10).close(); r = "connected"
        elif kind == "tcp6":
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(10); s.connect((host, port)); r = "connected"
        elif kind == "dns":
            r = "resolved " + repr(socket.getaddrinfo(host, 443, proto=socket.IPPROTO_TCP))
        elif kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
            s.sendto(b"bulkhead-probe", (host, port)); s.recvfrom(64); r = "reply"
        elif kind == "udp6":
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.settimeout(1.5)
            s.sendto(b"bulkhead-probe", (host, port)); s.recvfrom(64); r = "reply"
        elif kind == "raw":
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(1.5)
            s.sendto(b"\x08\x00\xf7\xfe\x00\x01\x00\x00", (host, 0)); s.recvfrom(64); r = "reply"
        elif kind == "vsock":
            s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); s.settimeout(2); s.connect((2, port)); r = "connected"
    except Exception as e:
        r = "error " + type(e).__name__ + ": " + str(e)
    out.append([kind, host, port, r, round(time.monotonic() - t, 3)])
print(json.dumps(out))
"""


def probe(sbx, targets, user="user"):
    code, out, err, _ = run_py(sbx, PROBE, json.dumps(targets), user=user)
    assert code == 0, err
    return json.loads(out)


def assert_all_fail_fast(results, limit=FAST):
    bad = [r for r in results if not r[3].startswith("error") or r[4] > limit]
    assert not bad, f"not denied fast (< {limit}s): {bad}"


def curl(sbx, url: str, *extra: str, timeout: int = 10):
    """(exit code, body, stderr, seconds) of a curl inside the sandbox."""
    args = " ".join(extra)
    return sh(sbx, f"curl -sS -m {timeout} {args} {url}", timeout=timeout + 30)


def put_ca(sbx, lab):
    """The upstream test CA (public certificate) for curl's --cacert on pass-through TLS."""
    sbx.files.write("/tmp/upstream-ca.pem", lab.pki.ca_cert.read_text())
    return "--cacert /tmp/upstream-ca.pem"


def wait_events(server, sid, pred, timeout=15):
    """Poll the audit endpoint until `pred(events)` holds; returns the events."""
    deadline = time.monotonic() + timeout
    while True:
        r = http("GET", f"{server.url}/sandboxes/{sid}/network/events?limit=1000", headers=server.api_headers())
        assert r.status == 200, r.body
        ev = r.json()
        if pred(ev) or time.monotonic() > deadline:
            return ev
        time.sleep(0.3)


# ---- default deny -------------------------------------------------------------------------------


def test_default_deny_everything_fails_fast(sandbox_factory, server, lab):
    sbx = sandbox_factory()
    info = sbx.get_info()
    assert info.allow_internet_access is False
    before = lab.counters()
    v4, v6 = host_addresses()
    port = int(server.url.rsplit(":", 1)[1])
    targets = [["tcp", a, port] for a in v4] + [["tcp6", a, port] for a in v6]
    targets += [
        ["tcp", egresslab.UPSTREAM_IP, 80],
        ["tcp", egresslab.UPSTREAM_IP, 443],
        ["dns", "api.allowed.test", 0],
        ["dns", "pypi.org", 0],
        ["udp", egresslab.UPSTREAM_IP, 53],
        ["udp", egresslab.UPSTREAM_IP, 9999],
        ["vsock", "host", 1024],
    ]
    targets += [["udp6", a, 53] for a in v6]
    assert_all_fail_fast(probe(sbx, targets))
    # Root with CAP_NET_RAW inside: raw ICMP has no way out either.
    assert_all_fail_fast(probe(sbx, [["raw", egresslab.UPSTREAM_IP, 0]], user="root"))
    # Nothing but loopback in the sandbox.
    _, out, _, _ = sh(sbx, "cat /proc/net/dev")
    ifaces = sorted(l.split(":")[0].strip() for l in out.splitlines()[2:])
    assert ifaces == ["lo"], ifaces
    after = lab.counters()
    for k in ("Icmp.InMsgs", "Udp.InDatagrams", "Udp.NoPorts", "Tcp.PassiveOpens"):
        assert after[k] == before[k], f"{k} changed: packets reached the upstream host"


def test_sandbox_trust_store_and_dns_config(sandbox):
    _, out, _, _ = sh(sandbox, "cat /etc/resolv.conf")
    assert "nameserver 10.200.0.1" in out
    _, env, _, _ = sh(sandbox, "env")
    for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "CURL_CA_BUNDLE"):
        assert f"{k}=/etc/ssl/certs/ca-certificates.crt" in env, env
    # The bundle cannot be changed from inside (host-owned, read-only bind) and holds the
    # template's roots, the deployment CA and the operator's bundle.
    code, _, err, _ = sh(sandbox, "echo x >> /etc/ssl/certs/ca-certificates.crt", user="root")
    assert code != 0 and ("Read-only" in err or "Permission denied" in err), err
    _, n, _, _ = sh(sandbox, "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt")
    assert int(n) > 100


# ---- allow by domain ----------------------------------------------------------------------------


def test_allow_by_domain_and_wildcard(sandbox_factory, server, lab):
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test", "*.wild.test"]})
    ca = put_ca(sbx, lab)
    for url in ("http://api.allowed.test/a", "https://api.allowed.test/b", "http://x.wild.test/c", "https://y.wild.test/d"):
        code, body, err, _ = curl(sbx, url, ca)
        assert code == 0, f"{url}: {err}"
        seen = json.loads(body)
        assert seen["path"] == "/" + url.rsplit("/", 1)[1], seen
        assert seen["tls"] == url.startswith("https"), seen
    # Not listed, the bare wildcard apex, a direct IP: denied, fast.
    for url in ("http://denied.test/", "https://denied.test/", "http://wild.test/", f"http://{egresslab.UPSTREAM_IP}/"):
        code, _, err, took = curl(sbx, url, ca)
        assert code != 0, f"{url} should be denied"
        assert took < FAST + 1, f"{url} took {took:.1f}s"
    paths = [r["path"] for r in lab.requests()]
    assert {"/a", "/b", "/c", "/d"} <= set(paths)


def test_deny_wins_and_fixed_deny_set_holds(sandbox_factory, server, lab):
    # The proxy refreshes its list of host addresses every 5 s; the lab's host-side veth
    # address (egresslab.HOST_SIDE_IP) appeared after the server started.
    time.sleep(max(0.0, lab.started + 6 - time.monotonic()))
    v4, v6 = host_addresses()
    port = int(server.url.rsplit(":", 1)[1])
    # allowOut names the host, loopback and the gateway: the fixed deny set still wins.
    sbx = sandbox_factory(
        allow_internet_access=True,
        network={"allow_out": ["127.0.0.1", "10.200.0.1", *v4, *[f"{a}/128" for a in v6]], "deny_out": [egresslab.UPSTREAM_IP]},
    )
    targets = [["tcp", a, port] for a in v4] + [["tcp", "10.200.0.1", 80], ["tcp", egresslab.UPSTREAM_IP, 80]]
    targets += [["tcp6", a, port] for a in v6]
    res = probe(sbx, targets)
    if any(not r[3].startswith("error") for r in res):
        ev = wait_events(server, sbx.sandbox_id, lambda ev: False, timeout=3)
        pytest.fail(f"not denied: {res}\naudit: {json.dumps(ev, indent=1)}")
    assert_all_fail_fast(res)
    # E2B's idiom: deny everything, allow one name (allow wins over deny).
    sbx2 = sandbox_factory(network={"allow_out": ["api.allowed.test"], "deny_out": ["0.0.0.0/0"]})
    code, _, err, _ = curl(sbx2, "http://api.allowed.test/idiom")
    assert code == 0, err
    code, _, _, took = curl(sbx2, f"http://{egresslab.UPSTREAM_IP}/")
    assert code != 0 and took < FAST + 1


def test_udp_raw_and_ipv6_never_leave_an_allowed_sandbox(sandbox_factory, lab):
    sbx = sandbox_factory(allow_internet_access=True)
    before = lab.counters()
    res = probe(sbx, [["udp", egresslab.UPSTREAM_IP, 9999], ["udp", egresslab.UPSTREAM_IP, 123]])
    res += probe(sbx, [["raw", egresslab.UPSTREAM_IP, 0]], user="root")
    assert all(r[3].startswith("error") for r in res), res
    _, out, _, _ = sh(sbx, "cat /proc/net/if_inet6 2>/dev/null | grep -v ' lo$' || true")
    assert out.strip() == "", f"IPv6 addresses on the link: {out}"
    after = lab.counters()
    for k in ("Icmp.InMsgs", "Udp.InDatagrams", "Udp.NoPorts"):
        assert after[k] == before[k], f"{k} changed: UDP/ICMP reached the upstream"


def test_sni_and_host_mismatch_are_refused(sandbox_factory, server, lab):
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    ca = put_ca(sbx, lab)
    _, ip, _, _ = sh(sbx, "getent hosts api.allowed.test | cut -d' ' -f1")
    ip = ip.strip()
    assert ip, "allowed name did not resolve"
    # Plain HTTP to the allowed name's address, asking for another host.
    code, body, err, took = curl(sbx, "http://api.allowed.test/smuggle", "-H 'Host: denied.test'")
    assert not (code == 0 and '"path"' in body), f"Host smuggling reached the upstream: {body}"
    # TLS with a denied SNI to the allowed name's address.
    code, body, err, took = curl(sbx, "https://denied.test/smuggle", ca, f"--resolve denied.test:443:{ip}")
    assert code != 0, body
    assert took < FAST + 1
    assert "/smuggle" not in [r["path"] for r in lab.requests()]
    ev = wait_events(server, sbx.sandbox_id, lambda ev: any(not e["allowed"] for e in ev if e["protocol"] in ("http", "tls")))
    assert any(not e["allowed"] for e in ev if e["protocol"] in ("http", "tls")), ev


def test_live_update_flips_access(sandbox_factory, server, lab):
    sbx = sandbox_factory()
    code, _, _, took = curl(sbx, "http://api.allowed.test/before")
    assert code != 0 and took < FAST + 1
    t = time.monotonic()
    sbx.update_network({"allow_out": ["api.allowed.test"]})
    code, body, err, _ = curl(sbx, "http://api.allowed.test/after")
    assert code == 0, err
    assert json.loads(body)["path"] == "/after"
    took_allow = time.monotonic() - t
    d = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}", headers=server.api_headers()).json()
    assert d["network"]["allowOut"] == ["api.allowed.test"], d
    # Replace with nothing: denied again at once.
    sbx.update_network({})
    code, _, _, took = curl(sbx, "http://api.allowed.test/again")
    assert code != 0 and took < FAST + 1
    # Raw PUT: bad input → 400, unknown sandbox → 404.
    r = http("PUT", f"{server.url}/sandboxes/{sbx.sandbox_id}/network", {"allowOut": ["not a domain"]}, headers=server.api_headers())
    assert r.status == 400 and "allowOut" in r.json()["message"], r.body
    r = http("PUT", f"{server.url}/sandboxes/nosuchsandbox0000000/network", {}, headers=server.api_headers())
    assert r.status == 404, r.body
    r = http("PUT", f"{server.url}/sandboxes/{sbx.sandbox_id}/network", {"allowOut": [], "egressProxy": {"address": "p:1080"}}, headers=server.api_headers())
    assert r.status == 400, r.body
    print(f"\nlive update → first allowed request: {took_allow*1000:.0f} ms")


def test_detail_reports_the_network_config(sandbox_factory, server):
    sbx = sandbox_factory(network={"allow_out": ["pypi.org"], "deny_out": ["10.0.0.0/8"]})
    r = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}", headers=server.api_headers())
    d = r.json()
    assert d["allowInternetAccess"] is False
    assert d["network"]["allowOut"] == ["pypi.org"] and d["network"]["denyOut"] == ["10.0.0.0/8"]
    # Bad config on create: 400 in E2B's shape.
    r = http("POST", f"{server.url}/v2/sandboxes", {"templateID": TEMPLATE, "network": {"allowOut": ["a b"]}}, headers=server.api_headers())
    assert r.status == 400 and r.json()["code"] == 400, r.body


# ---- secrets and injection ----------------------------------------------------------------------


def test_secrets_api_never_returns_values(server):
    name = f"bh-test-{secrets.token_hex(4)}"
    value = "v-" + secrets.token_hex(16)
    info = Secret.create(name, value, metadata={"k": "v"})
    try:
        assert info.name == name and info.version == 1 and info.metadata == {"k": "v"}
        assert Secret.get_info(name).secret_id == info.secret_id
        assert Secret.update(info.secret_id, value + "2").version == 2
        listed = []
        pager = Secret.list()
        while pager.has_next:
            listed += pager.next_items()
        assert name in [s.name for s in listed]
        for path in ("/secrets", f"/secrets/{info.secret_id}", f"/secrets/{name}"):
            r = http("GET", server.url + path, headers=server.api_headers())
            assert r.status == 200 and value.encode() not in r.body, r.body
        r = http("POST", server.url + "/secrets", {"name": name, "value": "x"}, headers=server.api_headers())
        assert r.status == 409, r.body
        r = http("POST", server.url + "/secrets", {"name": "a{b}", "value": "x"}, headers=server.api_headers())
        assert r.status == 400, r.body
    finally:
        assert Secret.destroy(name)
    assert not Secret.exists(name)
    assert Secret.destroy(name) is False


def test_header_injection_keeps_the_secret_outside(sandbox_factory, server, lab):
    name = f"bh-inject-{secrets.token_hex(4)}"
    value = "sk-live-" + secrets.token_hex(20)
    Secret.create(name, value)
    try:
        sbx = sandbox_factory(
            network={
                "allow_out": ["inject.allowed.test"],
                "rules": {"inject.allowed.test": [{"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}", "X-Bulkhead-Test": "static"}}}]},
            }
        )
        # The sandbox trusts the proxy's CA through its system bundle (no --cacert), and its
        # own Authorization header is overridden.
        code, body, err, _ = curl(sbx, "https://inject.allowed.test/inject", "-H 'Authorization: Bearer from-sandbox'")
        assert code == 0, err
        got = [r for r in lab.requests() if r["path"] == "/inject"]
        assert got, "the upstream saw no request"
        headers = {k.lower(): v for k, v in got[-1]["headers"]}
        assert headers["authorization"] == f"Bearer {value}"
        assert headers["x-bulkhead-test"] == "static"
        assert value not in body
        # Python (requests-style stack via urllib + SSL_CERT_FILE) too.
        code, out, err, _ = run_py(sbx, "import urllib.request;print(urllib.request.urlopen('https://inject.allowed.test/py').status)")
        assert code == 0 and out.strip() == "200", err

        # The secret is nowhere inside: env, every process's environ, any file; nor the CA key.
        key_pem = (server.data_dir / "egress" / "ca.key").read_text() if server.data_dir else ""
        key_chunk = max((l for l in key_pem.splitlines() if "-----" not in l), key=len, default="")
        hunt = r"""
import os, sys
needles = [n.encode() for n in sys.argv[1:] if n]
hits = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            data = open(f"/proc/{p}/environ", "rb").read()
        except OSError:
            continue
        hits += [f"environ of {p}" for n in needles if n in data]
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for f in files:
        path = os.path.join(root, f)
        try:
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 50_000_000:
                continue
            data = open(path, "rb").read()
        except OSError:
            continue
        hits += [path for n in needles if n in data]
print("\n".join(hits))
"""
        for user in ("root", "user"):
            code, out, err, _ = run_py(sbx, hunt, value, key_chunk, user=user, timeout=300)
            assert code == 0, err
            assert out.strip() == "", f"secret or CA key found inside the sandbox ({user}): {out}"
        _, env, _, _ = sh(sbx, "env", user="root")
        assert value not in env
        _, grep, _, _ = sh(sbx, "grep -rl 'PRIVATE KEY' /etc/ssl 2>/dev/null || true", user="root")
        assert grep.strip() == "", grep
        # The secret's placeholder is visible in the config (that is fine), never the value.
        r = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}", headers=server.api_headers())
        assert value.encode() not in r.body
        assert Secret.fill(name).encode() in r.body
    finally:
        Secret.destroy(name)


# ---- audit --------------------------------------------------------------------------------------


def test_audit_trail_lists_allowed_and_denied_with_bytes(sandbox_factory, server, lab):
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    ca = put_ca(sbx, lab)
    assert curl(sbx, "https://api.allowed.test/audit", ca)[0] == 0
    assert curl(sbx, "http://denied.test/")[0] != 0
    assert curl(sbx, f"http://{egresslab.UPSTREAM_IP}/")[0] != 0

    def done(ev):
        return any(e["allowed"] and e["host"] == "api.allowed.test" and e["protocol"] == "tls" for e in ev) and any(
            not e["allowed"] and e["ip"] == egresslab.UPSTREAM_IP for e in ev
        )

    ev = wait_events(server, sbx.sandbox_id, done)
    assert done(ev), ev
    tls = [e for e in ev if e["allowed"] and e["protocol"] == "tls" and e["host"] == "api.allowed.test"][-1]
    assert tls["bytesOut"] > 0 and tls["bytesIn"] > 0 and tls["port"] == 443 and tls["rule"], tls
    assert any(not e["allowed"] and e["host"] == "denied.test" for e in ev), ev
    for e in ev:
        assert e["sandboxID"] == sbx.sandbox_id and e["timestamp"].endswith("Z")
    # The CLI shows the same trail.
    env = dict(os.environ, E2B_API_URL=server.url, E2B_API_KEY=server.api_key)
    binary = os.environ.get("BULKHEAD_BIN", str(REPO / "target" / "debug" / "bulkhead"))
    out = subprocess.run([binary, "sandbox", "network-events", sbx.sandbox_id], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "api.allowed.test" in out.stdout and " allow " in out.stdout and " deny " in out.stdout, out.stdout
    r = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}/network/events?limit=0", headers=server.api_headers())
    assert r.status == 400
    # Still readable after the sandbox is gone.
    sbx.kill()
    r = http("GET", f"{server.url}/sandboxes/{sbx.sandbox_id}/network/events", headers=server.api_headers())
    assert r.status == 200 and len(r.json()) >= 3


# ---- real package installs ----------------------------------------------------------------------

REGISTRIES = ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"]


def _installer_template(server):
    want = os.environ.get("BULKHEAD_TEST_NET_TEMPLATE", "code-interpreter-v1")
    r = http("GET", f"{server.url}/templates", headers=server.api_headers())
    names = {n for t in r.json() for n in [t["templateID"], *t.get("aliases", [])]}
    if want not in names:
        pytest.skip(f"SKIPPED: template {want!r} (with pip and npm) is not registered on this server: {sorted(names)}")
    return want


def test_pip_and_npm_install_through_the_proxy(server):
    template = _installer_template(server)
    sbx = Sandbox.create(template=template, timeout=600, network={"allow_out": REGISTRIES})
    try:
        code, out, err, took = sh(sbx, "cd /tmp && python3 -m pip install --no-cache-dir --target /tmp/pylib six && PYTHONPATH=/tmp/pylib python3 -c 'import six; print(six.__version__)'", timeout=300)
        assert code == 0, f"pip install failed:\n{out}\n{err}"
        print(f"\npip install six: {took:.1f}s")
        code, out, err, took = sh(sbx, "mkdir -p /tmp/n && cd /tmp/n && npm install --no-audit --no-fund is-number && node -e 'console.log(require(\"is-number\")(5))'", timeout=300)
        assert code == 0, f"npm install failed:\n{out}\n{err}"
        assert out.strip().endswith("true"), out
        print(f"npm install is-number: {took:.1f}s")
    finally:
        sbx.kill()

    # Without the registries: the same commands fail fast with a clear error.
    sbx = Sandbox.create(template=template, timeout=300)
    try:
        code, out, err, took = sh(sbx, "cd /tmp && python3 -m pip install --no-cache-dir --target /tmp/pylib six", timeout=120)
        assert code != 0
        assert took < 10, f"pip took {took:.1f}s to fail"
        text = out + err
        assert any(s in text for s in ("Temporary failure in name resolution", "Failed to establish a new connection", "Network is unreachable", "No matching distribution")), text
        code, out, err, took = sh(sbx, "mkdir -p /tmp/n && cd /tmp/n && npm install --no-audit --no-fund is-number", timeout=120)
        assert code != 0
        assert took < 10, f"npm took {took:.1f}s to fail"
        assert any(s in out + err for s in ("ENOTFOUND", "EAI_AGAIN", "ENETUNREACH", "network")), out + err
    finally:
        sbx.kill()


def test_links_come_back_after_a_server_restart(sandbox_factory, server, lab):
    if not server.owned:
        pytest.skip("SKIPPED: needs a server started by this suite (it is restarted)")
    linked = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    closed = sandbox_factory()
    assert curl(linked, "http://api.allowed.test/pre-restart")[0] == 0
    server.restart()
    # The TUN fds died with the old process; the re-adopted sandbox gets a new link.
    code, body, err, _ = curl(linked, "http://api.allowed.test/post-restart")
    assert code == 0, err
    assert json.loads(body)["path"] == "/post-restart"
    code, _, _, took = curl(closed, "http://api.allowed.test/")
    assert code != 0 and took < FAST + 1
