"""Behaviours the official SDK's users count on, each as E2B's envd and API behave (issue 9,
part 2): write results with metadata, writes and make_dir that create top-level parents
(and what stays refused: /proc, /sys, /dev, the agent's files), the watch events
of a new file, the expired-signature answer, inclusive `started_after`, the metrics series, the
error of a command whose sandbox is killed, and `get_host` with the server's sandbox domain."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time

import pytest
import requests
from e2b import (
    CommandExitException,
    FilesystemEventType,
    SandboxException,
    Sandbox,
    SandboxNotRunningException,
    SandboxQuery,
)

from _util import aware, poll

_NO_PROXY = {"http": None, "https": None}


@pytest.mark.parametrize("octet_stream", [True, False], ids=["octet-stream", "multipart"])
def test_write_returns_metadata_and_an_overwrite_without_it_clears_it(sandbox, octet_stream):
    path = f"/home/user/meta-{'raw' if octet_stream else 'form'}.txt"
    md = {"owner": "alice", "kind": "report-v2"}
    info = sandbox.files.write(path, "one", metadata=md, use_octet_stream=octet_stream)
    assert info.metadata == md
    assert sandbox.files.get_info(path).metadata == md
    # Overwriting without metadata clears it (envd rewrites the whole set on every write).
    info = sandbox.files.write(path, "two", use_octet_stream=octet_stream)
    assert not info.metadata
    assert not sandbox.files.get_info(path).metadata
    assert sandbox.files.read(path) == "two"
    # New metadata replaces the old set rather than merging with it.
    sandbox.files.write(path, "3", metadata={"a": "1"}, use_octet_stream=octet_stream)
    info = sandbox.files.write(path, "4", metadata={"b": "2"}, use_octet_stream=octet_stream)
    assert info.metadata == {"b": "2"}
    assert sandbox.files.get_info(path).metadata == {"b": "2"}


def test_write_files_returns_each_files_metadata(sandbox):
    infos = sandbox.files.write_files(
        [{"path": "/home/user/m1.txt", "data": "1"}, {"path": "/home/user/m2.txt", "data": "2"}],
        metadata={"batch": "7"},
    )
    assert [i.metadata for i in infos] == [{"batch": "7"}, {"batch": "7"}]


def test_write_creates_missing_parents_in_root_owned_dirs_for_the_default_user(sandbox):
    # /opt and /srv belong to root: as on E2B, envd creates the missing parents for the user.
    info = sandbox.files.write("/opt/0/x.txt", "x")
    assert info.path == "/opt/0/x.txt"
    assert sandbox.files.read("/opt/0/x.txt") == "x"
    sandbox.files.write("/srv/deep/er/y.txt", "y", use_octet_stream=False)
    # As envd: the new directories and the file belong to the user.
    out = sandbox.commands.run("stat -c '%U %a %n' /opt /opt/0 /opt/0/x.txt /srv/deep /srv/deep/er/y.txt").stdout
    assert out.splitlines() == [
        "root 755 /opt",
        "user 755 /opt/0",
        "user 644 /opt/0/x.txt",
        "user 755 /srv/deep",
        "user 644 /srv/deep/er/y.txt",
    ]
    # Existing files and directories keep their permissions: root's stay root's.
    with pytest.raises(Exception):
        sandbox.files.write("/etc/not-allowed.txt", "x")
    with pytest.raises(Exception):
        sandbox.files.write("/etc/passwd", "x")
    assert sandbox.commands.run("stat -c %U /etc/passwd").stdout == "root\n"


@pytest.mark.parametrize("octet_stream", [True, False], ids=["octet-stream", "multipart"])
def test_write_creates_new_top_level_directories_for_the_default_user(sandbox, octet_stream):
    # As on E2B: envd (root) makes the missing parents, directly under / too, and hands each
    # new directory to the user; the file is the user's.
    top = f"/0{'r' if octet_stream else 'm'}"
    info = sandbox.files.write(f"{top}/x.txt", "x", use_octet_stream=octet_stream)
    assert info.path == f"{top}/x.txt"
    assert sandbox.files.read(f"{top}/x.txt") == "x"
    sandbox.files.write(f"{top}deep/a/b/y.txt", "y", use_octet_stream=octet_stream)
    out = sandbox.commands.run(f"stat -c '%U:%G %a %n' / {top} {top}/x.txt {top}deep {top}deep/a/b {top}deep/a/b/y.txt")
    assert out.stdout.splitlines() == [
        "root:root 755 /",
        f"user:user 755 {top}",
        f"user:user 644 {top}/x.txt",
        f"user:user 755 {top}deep",
        f"user:user 755 {top}deep/a/b",
        f"user:user 644 {top}deep/a/b/y.txt",
    ]
    # The directory is the user's: their own processes write there too, and list it.
    assert sandbox.commands.run(f"echo more > {top}/z.txt && cat {top}/z.txt").stdout == "more\n"
    assert {e.name for e in sandbox.files.list(top)} == {"x.txt", "z.txt"}
    # A write_files batch (one multipart request) with new top-level parents.
    infos = sandbox.files.write_files([{"path": f"{top}b1/1.txt", "data": "1"}, {"path": f"{top}b2/2.txt", "data": "2"}])
    assert [i.path for i in infos] == [f"{top}b1/1.txt", f"{top}b2/2.txt"]
    assert sandbox.files.read(f"{top}b2/2.txt") == "2"


def test_make_dir_creates_new_top_level_directories_for_the_default_user(sandbox):
    assert sandbox.files.make_dir("/newtop/a/b") is True
    assert sandbox.files.make_dir("/newtop/a/b") is False
    out = sandbox.commands.run("stat -c '%U:%G %a %n' /newtop /newtop/a /newtop/a/b").stdout
    assert out.splitlines() == ["user:user 755 /newtop", "user:user 755 /newtop/a", "user:user 755 /newtop/a/b"]
    # As envd: the user's new directories anywhere, existing ones left as they are.
    assert sandbox.files.make_dir("/opt/made/here") is True
    out = sandbox.commands.run("stat -c '%U %n' /opt /opt/made /opt/made/here").stdout
    assert out.splitlines() == ["root /opt", "user /opt/made", "user /opt/made/here"]
    # As root: root's.
    assert sandbox.files.make_dir("/roottop/x", user="root") is True
    assert sandbox.commands.run("stat -c %U /roottop /roottop/x").stdout == "root\nroot\n"
    # Processes may make top-level directories as on E2B: root may, the user through sudo.
    sandbox.commands.run("mkdir /byroot && echo r > /byroot/f && cat /byroot/f", user="root")
    with pytest.raises(CommandExitException):
        sandbox.commands.run("mkdir /byuser")  # / is root's (0755), as on E2B


# procfs has no entry to create, so a new name in /proc does not exist (404); the others are
# read-only mounts or root's (403).
REFUSED = "(?i)permission denied|does not exist"
KERNEL_AND_AGENT_PATHS = [
    "/proc/x.txt",
    "/proc/new/x.txt",
    "/proc/self/oom_score_adj",
    "/sys/x.txt",
    "/sys/new/x.txt",
    "/dev/x.txt",
    "/dev/new/x.txt",
    "/dev/pts/x.txt",
    "/run/bulkhead/agent",
    "/run/bulkhead/sock/agent.log",
    "/run/bulkhead/sock/agent.sock",
]


@pytest.mark.parametrize("user", ["user", "root"])
@pytest.mark.parametrize("octet_stream", [True, False], ids=["octet-stream", "multipart"])
def test_writes_to_kernel_filesystems_and_the_agents_files_are_refused(sandbox, user, octet_stream):
    agent_sum = sandbox.commands.run("sha256sum /run/bulkhead/agent", user="root").stdout
    for path in KERNEL_AND_AGENT_PATHS:
        if user == "root" and path.startswith("/run/bulkhead/sock/"):
            continue  # the sandbox's root owns its agent's socket directory (it can ptrace the agent anyway)
        with pytest.raises(SandboxException) as e:
            sandbox.files.write(path, "x", user=user, use_octet_stream=octet_stream)
        assert re.search(REFUSED, str(e.value)), (path, e.value)
    for path in ("/proc/newdir", "/sys/newdir", "/dev/newdir", "/dev/pts/newdir"):
        with pytest.raises(SandboxException, match=REFUSED):
            sandbox.files.make_dir(path, user=user)
    # Nothing was created, and the agent's binary is intact.
    listing = sandbox.commands.run("ls -a /proc/ /sys/ /dev/ /dev/pts/ /run/bulkhead/sock", user="root").stdout
    assert "x.txt" not in listing and "new" not in listing.split()
    assert "newdir" not in listing
    assert sandbox.commands.run("sha256sum /run/bulkhead/agent", user="root").stdout == agent_sum


def test_top_level_symlinks_into_kernel_filesystems_do_not_open_them(sandbox):
    # Made by the sandbox's root (as on E2B, it may), before the default user's write.
    sandbox.commands.run(
        "ln -s /proc/self /0 && ln -s /dev /1 && ln -s /sys /2 && ln -s /run/bulkhead/sock /3 && ln -s /proc/1/root/.. /4",
        user="root",
    )
    for path in ("/0/x.txt", "/0/sub/x.txt", "/1/x.txt", "/1/sub/x.txt", "/2/x.txt", "/3/x.txt", "/3/agent.log"):
        for octet_stream in (True, False):
            with pytest.raises(SandboxException, match=REFUSED):
                sandbox.files.write(path, "x", use_octet_stream=octet_stream)
    with pytest.raises(SandboxException, match=REFUSED):
        sandbox.files.make_dir("/0/sub")
    # `/proc/1/root/..` is the sandbox's own root: a write there lands inside the sandbox.
    sandbox.files.write("/4/via-root/x.txt", "inside", user="root")
    assert sandbox.commands.run("cat /via-root/x.txt").stdout == "inside"
    listing = sandbox.commands.run("ls -a /dev /sys", user="root").stdout
    assert "x.txt" not in listing and "sub" not in listing.split()


def test_watch_reports_a_new_files_create_chmod_write(sandbox):
    sandbox.files.make_dir("/home/user/wseq")
    h = sandbox.files.watch_dir("/home/user/wseq")
    sandbox.files.write("/home/user/wseq/new.txt", "content")
    events = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events += [e for e in h.get_new_events() if e.name == "new.txt"]
        if len(events) >= 3:
            time.sleep(0.5)
            events += [e for e in h.get_new_events() if e.name == "new.txt"]
            break
        time.sleep(0.1)
    h.stop()
    # envd opens the file (CREATE), hands it to the user (CHMOD), then writes it (WRITE).
    assert [e.type for e in events] == [
        FilesystemEventType.CREATE,
        FilesystemEventType.CHMOD,
        FilesystemEventType.WRITE,
    ], events


def test_expired_signed_url_answers_envds_body(sandbox):
    sandbox.files.write("/home/user/exp.txt", "x")
    url = sandbox.download_url("/home/user/exp.txt", use_signature_expiration=1)
    time.sleep(2.5)
    r = requests.get(url, proxies=_NO_PROXY, timeout=30)
    assert r.status_code == 401
    assert r.json() == {"code": 401, "message": "signature is already expired"}


def test_list_started_after_includes_a_sandbox_started_at_that_instant(sandbox_factory, run_id):
    tag = f"sa-{time.monotonic_ns()}"
    sbx = sandbox_factory(metadata={"started-after": tag})
    started = aware(Sandbox.get_info(sbx.sandbox_id).started_at)

    def ids(after):
        q = SandboxQuery(metadata={"started-after": tag}, started_after=after)
        return {s.sandbox_id for s in Sandbox.list(query=q).next_items()}

    assert ids(started) == {sbx.sandbox_id}
    assert ids(started - dt.timedelta(seconds=1)) == {sbx.sandbox_id}
    assert ids(started + dt.timedelta(milliseconds=1)) == set()


def test_get_metrics_returns_the_series_in_the_range(sandbox):
    # E2B samples every 5 s; wait for at least three samples.
    series = poll(lambda: (lambda m: m if len(m) >= 3 else None)(sandbox.get_metrics()), timeout=30, interval=1)
    assert series, "fewer than 3 samples after 30 s"
    stamps = [aware(m.timestamp) for m in series]
    assert stamps == sorted(stamps)
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    assert all(3 <= g <= 7 for g in gaps[1:]), gaps
    for m in series:
        assert m.cpu_count >= 1 and 0 < m.mem_used <= m.mem_total
    # A range holds exactly the samples whose second falls in it (both ends inclusive).
    lo, hi = stamps[1].replace(microsecond=0), stamps[-1].replace(microsecond=0)
    ranged = sandbox.get_metrics(start=lo, end=hi)
    assert [aware(m.timestamp) for m in ranged][: len(stamps) - 1] == stamps[1:]
    assert all(lo <= aware(m.timestamp).replace(microsecond=0) <= hi for m in ranged)
    # Before the sandbox started: nothing.
    early = stamps[0] - dt.timedelta(hours=1)
    assert sandbox.get_metrics(start=early, end=early + dt.timedelta(minutes=1)) == []
    with pytest.raises(Exception, match="(?i)time range"):
        sandbox.get_metrics(start=hi, end=lo - dt.timedelta(seconds=1))


def test_command_streaming_when_the_sandbox_is_killed_raises_not_running(sandbox_factory):
    sbx = sandbox_factory()
    killer = threading.Timer(2.0, lambda: Sandbox.kill(sbx.sandbox_id))
    killer.start()
    try:
        with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
            sbx.commands.run("for i in $(seq 1 60); do echo tick $i; sleep 1; done", timeout=120)
    finally:
        killer.join()


def test_get_host_serves_an_in_sandbox_port_by_host_header(sandbox, server):
    domain = server.sandbox_domain
    assert sandbox.sandbox_domain == domain
    host = sandbox.get_host(8123)
    assert host == f"8123-{sandbox.sandbox_id}.{domain}"
    sandbox.files.write("/home/user/site/index.html", "served from the sandbox")
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8123 --bind 127.0.0.1", background=True)
    port = server.url.rsplit(":", 1)[1]

    def get():
        r = requests.get(f"http://127.0.0.1:{port}/index.html", headers={"Host": host}, proxies=_NO_PROXY, timeout=30)
        return r if r.status_code == 200 else None

    r = poll(get, timeout=20, interval=0.3)
    assert r is not None, "the in-sandbox server was not reachable through its host"
    assert r.text == "served from the sandbox"
    # Nothing on a port: E2B's answer.
    r = requests.get(
        f"http://127.0.0.1:{port}/", headers={"Host": f"8124-{sandbox.sandbox_id}.{domain}"}, proxies=_NO_PROXY, timeout=30
    )
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"]
