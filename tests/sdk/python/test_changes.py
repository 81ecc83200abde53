"""Change tracking (Bulkhead's `GET /sandboxes/{id}/changes`): files created, modified and
deleted through the official SDK are listed from the sandbox's overlay upper layer."""

from __future__ import annotations

import os

import pytest

from bulkhead_testlib import http


def changes(server, sandbox_id, query=""):
    r = http("GET", f"{server.url}/sandboxes/{sandbox_id}/changes{query}", headers=server.api_headers())
    return r


def test_changes_list_created_modified_deleted(server, sandbox):
    sandbox.files.write("/home/user/proj/main.py", "print('hi')\n")
    sandbox.files.make_dir("/home/user/proj/pkg")
    sandbox.commands.run("echo extra >> /etc/hostname && rm /etc/issue && ln -s main.py /home/user/proj/link", user="root")
    sandbox.files.write("/tmp/scratch.txt", "on the disk, as on E2B")
    sandbox.commands.run("echo x > /dev/shm/not-tracked")

    r = changes(server, sandbox.sandbox_id)
    assert r.status == 200, r.body
    got = {c["path"]: c for c in r.json()}
    main = got["/home/user/proj/main.py"]
    assert (main["kind"], main["type"], main["size"]) == ("created", "file", 12)
    assert main["mtime"].endswith("Z")
    assert (got["/home/user/proj/pkg"]["kind"], got["/home/user/proj/pkg"]["type"]) == ("created", "dir")
    assert got["/home/user/proj/link"]["type"] == "symlink"
    assert got["/etc/hostname"]["kind"] == "modified"
    issue = got["/etc/issue"]
    assert (issue["kind"], issue["type"], issue["size"]) == ("deleted", "file", 0)
    assert "mtime" not in issue
    assert got["/tmp/scratch.txt"]["kind"] == "created"
    # Bookkeeping of the jail, tmpfs files (/dev/shm) and untouched parents are not changes.
    for path in ("/etc/resolv.conf", "/dev/shm/not-tracked", "/etc", "/home/user", "/home"):
        assert path not in got, path
    assert [c["path"] for c in r.json()] == sorted(got)

    # Errors in E2B's shape.
    r = changes(server, "nosuchsandbox0000000")
    assert r.status == 404 and r.json()["code"] == 404
    r = changes(server, sandbox.sandbox_id, "?since=nosuchsnapshot")
    assert r.status == 404, r.body
    r = http("GET", f"{server.url}/sandboxes/{sandbox.sandbox_id}/changes")
    assert r.status == 401


def test_changes_of_a_paused_sandbox_and_since_a_snapshot(server, sandbox):
    if not os.environ.get("BULKHEAD_CRIU"):
        pytest.skip("SKIPPED: snapshots and pause need CRIU (BULKHEAD_CRIU, set by scripts/test.sh)")
    sandbox.files.write("/home/user/before.txt", "before the snapshot")
    snap = sandbox.create_snapshot()
    sandbox.files.write("/home/user/after.txt", "after the snapshot")
    sandbox.files.write("/home/user/before.txt", "rewritten after the snapshot!")

    r = changes(server, sandbox.sandbox_id, f"?since={snap.snapshot_id}")
    assert r.status == 200, r.body
    since = {c["path"]: c["kind"] for c in r.json()}
    assert since.get("/home/user/after.txt") == "created", since
    assert since.get("/home/user/before.txt") == "modified", since

    # Paused: listed from the pause's checkpoint, the same as while it ran.
    running = changes(server, sandbox.sandbox_id).json()
    sandbox.pause(mode="filesystem")
    r = changes(server, sandbox.sandbox_id)
    assert r.status == 200, r.body
    paused = {c["path"]: c for c in r.json()}
    for c in running:
        if c["path"].startswith("/home/user/"):
            assert paused.get(c["path"], {}).get("kind") == c["kind"], (c, paused.get(c["path"]))
