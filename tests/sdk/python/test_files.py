"""`sandbox.files` through the current Python SDK (envd /files and filesystem.Filesystem), plus
signed upload/download URLs used with plain HTTP clients."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import io
import os
import time
import urllib.parse
import urllib.request
import uuid

import pytest
import requests
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    SandboxException,
)

from _util import aware, now_utc
from bulkhead_testlib import TEMPLATE

MiB = 1024 * 1024
_NO_PROXY = {"http": None, "https": None}
# How the server may refuse a bad, missing or expired signature: 401/403 from the agent, or
# 400/404/502 when the router cannot match the signature to any sandbox.
REFUSED = (400, 401, 403, 404, 502)


def _sha(sbx, path, user=None):
    return sbx.commands.run(f"sha256sum '{path}' | cut -d' ' -f1", user=user, timeout=120).stdout.strip()


def test_write_read_text(sandbox):
    text = "héllo wörld ✓\nsecond line\n"
    info = sandbox.files.write("/home/user/hello.txt", text)
    assert info.path == "/home/user/hello.txt"
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.read("/home/user/hello.txt") == text
    # It is a real file in the sandbox, owned by the default user.
    assert sandbox.commands.run("cat /home/user/hello.txt").stdout == text
    assert sandbox.commands.run("stat -c %U:%G /home/user/hello.txt").stdout == "user:user\n"


def test_relative_paths_resolve_against_home(sandbox):
    info = sandbox.files.write("rel/dir/file.txt", "rel")
    assert info.path == "/home/user/rel/dir/file.txt"
    assert sandbox.commands.run("cat /home/user/rel/dir/file.txt").stdout == "rel"
    assert sandbox.files.read("rel/dir/file.txt") == "rel"
    sandbox.files.write("root-rel.txt", "r", user="root")
    assert sandbox.commands.run("cat /root/root-rel.txt", user="root").stdout == "r"


def test_write_read_bytes_and_stream(sandbox):
    data = bytes(range(256)) * 64 + b"\x00\xff\x00"
    sandbox.files.write("/home/user/bin.dat", data)
    got = sandbox.files.read("/home/user/bin.dat", format="bytes")
    assert isinstance(got, (bytes, bytearray))
    assert bytes(got) == data
    stream = sandbox.files.read("/home/user/bin.dat", format="stream")
    assert b"".join(stream) == data
    # gzip both ways.
    sandbox.files.write("/home/user/gz.dat", data, gzip=True)
    assert bytes(sandbox.files.read("/home/user/gz.dat", format="bytes", gzip=True)) == data
    assert _sha(sandbox, "/home/user/gz.dat") == hashlib.sha256(data).hexdigest()


def test_overwrite_truncates(sandbox):
    sandbox.files.write("/home/user/ow.txt", "a long first version\n")
    sandbox.files.write("/home/user/ow.txt", "short")
    assert sandbox.files.read("/home/user/ow.txt") == "short"


def test_write_as_root_and_permissions(sandbox):
    sandbox.files.write("/root/secret.txt", "only root", user="root")
    assert sandbox.files.read("/root/secret.txt", user="root") == "only root"
    assert sandbox.commands.run("stat -c %U /root/secret.txt", user="root").stdout == "root\n"
    with pytest.raises((SandboxException, Exception)):
        sandbox.files.read("/root/secret.txt")
    with pytest.raises((SandboxException, Exception)):
        sandbox.files.write("/etc/not-allowed.txt", "x")


def test_read_missing_is_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/does-not-exist.txt")


def test_large_file_roundtrip(sandbox):
    data = os.urandom(50 * MiB + 12345)
    digest = hashlib.sha256(data).hexdigest()
    t0 = time.monotonic()
    sandbox.files.write("/home/user/large.bin", data, request_timeout=600)
    assert sandbox.files.get_info("/home/user/large.bin").size == len(data)
    assert _sha(sandbox, "/home/user/large.bin") == digest
    got = sandbox.files.read("/home/user/large.bin", format="bytes", request_timeout=600)
    assert len(got) == len(data)
    assert hashlib.sha256(got).hexdigest() == digest
    # Streamed both ways (octet-stream upload from a file object, chunked download).
    sandbox.files.write("/home/user/large2.bin", io.BytesIO(data))
    h = hashlib.sha256()
    n = 0
    for chunk in sandbox.files.read("/home/user/large2.bin", format="stream"):
        h.update(chunk)
        n += len(chunk)
    assert n == len(data) and h.hexdigest() == digest
    assert time.monotonic() - t0 < 300


def test_write_files_many(sandbox):
    entries = [{"path": f"/home/user/many/d{i % 5}/f{i}.txt", "data": f"content {i}\n"} for i in range(50)]
    entries.append({"path": "/home/user/many/bin.dat", "data": b"\x00\x01\x02"})
    infos = sandbox.files.write_files(entries)
    assert sorted(i.path for i in infos) == sorted(e["path"] for e in entries)
    assert sandbox.commands.run("find /home/user/many -type f | wc -l").stdout.strip() == "51"
    assert sandbox.files.read("/home/user/many/d3/f13.txt") == "content 13\n"
    assert bytes(sandbox.files.read("/home/user/many/bin.dat", format="bytes")) == b"\x00\x01\x02"


def test_list_with_depth(sandbox):
    sandbox.commands.run("mkdir -p /home/user/tree/a/b/c && echo top > /home/user/tree/top.txt && echo deep > /home/user/tree/a/b/c/deep.txt")
    d1 = sandbox.files.list("/home/user/tree")
    assert {e.name for e in d1} == {"a", "top.txt"}
    by_name = {e.name: e for e in d1}
    assert by_name["a"].type == FileType.DIR
    assert by_name["top.txt"].type == FileType.FILE
    assert by_name["top.txt"].path == "/home/user/tree/top.txt"
    assert by_name["top.txt"].size == 4
    d2 = sandbox.files.list("/home/user/tree", depth=2)
    assert {e.path for e in d2} == {"/home/user/tree/a", "/home/user/tree/top.txt", "/home/user/tree/a/b"}
    d4 = sandbox.files.list("/home/user/tree", depth=4)
    assert "/home/user/tree/a/b/c/deep.txt" in {e.path for e in d4}
    with pytest.raises(NotFoundException):
        sandbox.files.list("/home/user/no-such-dir")


def test_exists(sandbox):
    sandbox.files.write("/home/user/ex.txt", "x")
    assert sandbox.files.exists("/home/user/ex.txt") is True
    assert sandbox.files.exists("/home/user") is True
    assert sandbox.files.exists("/home/user/nope.txt") is False
    assert sandbox.files.exists("/nope/nope") is False


def test_get_info(sandbox):
    before = now_utc() - dt.timedelta(seconds=5)
    sandbox.files.write("/home/user/info.txt", "12345")
    sandbox.commands.run("chmod 640 /home/user/info.txt && ln -s /home/user/info.txt /home/user/info-link")
    info = sandbox.files.get_info("/home/user/info.txt")
    assert info.name == "info.txt"
    assert info.path == "/home/user/info.txt"
    assert info.type == FileType.FILE
    assert info.size == 5
    assert info.mode & 0o777 == 0o640
    assert info.permissions == "-rw-r-----"
    assert info.owner == "user" and info.group == "user"
    assert before <= aware(info.modified_time) <= now_utc() + dt.timedelta(seconds=5)
    d = sandbox.files.get_info("/home/user")
    assert d.type == FileType.DIR and d.name == "user"
    link = sandbox.files.get_info("/home/user/info-link")
    assert link.type == FileType.SYMLINK
    assert link.symlink_target and link.symlink_target.endswith("info.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("/home/user/missing")


def test_make_dir(sandbox):
    assert sandbox.files.make_dir("/home/user/newdir") is True
    assert sandbox.files.make_dir("/home/user/newdir") is False
    assert sandbox.files.make_dir("/home/user/m/n/o") is True
    assert sandbox.files.get_info("/home/user/m/n/o").type == FileType.DIR
    assert sandbox.commands.run("stat -c %U /home/user/m/n/o").stdout == "user\n"


def test_rename(sandbox):
    sandbox.files.write("/home/user/old.txt", "moving")
    info = sandbox.files.rename("/home/user/old.txt", "/home/user/new.txt")
    assert info.path == "/home/user/new.txt" and info.name == "new.txt"
    assert not sandbox.files.exists("/home/user/old.txt")
    assert sandbox.files.read("/home/user/new.txt") == "moving"
    sandbox.files.write("/home/user/dir1/inner.txt", "inner")
    sandbox.files.rename("/home/user/dir1", "/home/user/dir2")
    assert sandbox.files.read("/home/user/dir2/inner.txt") == "inner"
    with pytest.raises(NotFoundException):
        sandbox.files.rename("/home/user/missing", "/home/user/x")


def test_remove(sandbox):
    sandbox.files.write("/home/user/rm.txt", "x")
    sandbox.files.remove("/home/user/rm.txt")
    assert not sandbox.files.exists("/home/user/rm.txt")
    sandbox.files.write("/home/user/rmdir/a/b.txt", "x")
    sandbox.files.remove("/home/user/rmdir")
    assert not sandbox.files.exists("/home/user/rmdir")


def _collect_events(handle, want, timeout=10):
    """Poll a sync watch handle until every (type, name) in `want` was seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += handle.get_new_events()
        got = {(e.type, e.name) for e in seen}
        if want <= got:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"missing events {want - {(e.type, e.name) for e in seen}}; saw {seen}")


def test_watch_dir_sync_polling(sandbox):
    sandbox.files.make_dir("/home/user/watched")
    h = sandbox.files.watch_dir("/home/user/watched")
    sandbox.files.write("/home/user/watched/a.txt", "1")
    sandbox.commands.run("echo more >> /home/user/watched/a.txt")
    sandbox.files.rename("/home/user/watched/a.txt", "/home/user/watched/b.txt")
    sandbox.files.remove("/home/user/watched/b.txt")
    events = _collect_events(
        h,
        {
            (FilesystemEventType.CREATE, "a.txt"),
            (FilesystemEventType.WRITE, "a.txt"),
            (FilesystemEventType.RENAME, "a.txt"),
            (FilesystemEventType.REMOVE, "b.txt"),
        },
    )
    names = {e.name for e in events}
    assert names <= {"a.txt", "b.txt"}, names
    # Events are drained by each poll: once activity has settled, a poll returns nothing.
    time.sleep(0.5)
    h.get_new_events()
    assert h.get_new_events() == []
    h.stop()
    with pytest.raises(SandboxException):
        h.get_new_events()


def test_watch_dir_recursive_and_entry(sandbox):
    sandbox.files.make_dir("/home/user/rwatch/sub")
    h = sandbox.files.watch_dir("/home/user/rwatch", recursive=True, include_entry=True)
    sandbox.files.write("/home/user/rwatch/sub/nested.txt", "n")
    events = _collect_events(h, {(FilesystemEventType.CREATE, "sub/nested.txt")})
    created = [e for e in events if e.type == FilesystemEventType.CREATE and e.name == "sub/nested.txt"]
    assert created[0].entry is not None
    assert created[0].entry.path == "/home/user/rwatch/sub/nested.txt"
    h.stop()


def test_watch_dir_not_a_directory(sandbox):
    sandbox.files.write("/home/user/plain.txt", "x")
    with pytest.raises(SandboxException):
        sandbox.files.watch_dir("/home/user/plain.txt")


def test_watch_dir_async_stream(run_id):
    async def main():
        sbx = await AsyncSandbox.create(template=TEMPLATE, timeout=120, metadata={"bulkhead-test": run_id})
        try:
            await sbx.files.make_dir("/home/user/awatch")
            events = []
            got_all = asyncio.Event()
            want = {
                (FilesystemEventType.CREATE, "one.txt"),
                (FilesystemEventType.CREATE, "deep/two.txt"),
                (FilesystemEventType.REMOVE, "one.txt"),
            }
            exits = []

            def on_event(e):
                events.append(e)
                if want <= {(x.type, x.name) for x in events}:
                    got_all.set()

            handle = await sbx.files.watch_dir(
                "/home/user/awatch", on_event=on_event, on_exit=exits.append, recursive=True, timeout=60
            )
            await sbx.files.write("/home/user/awatch/one.txt", "1")
            await sbx.files.make_dir("/home/user/awatch/deep")
            await sbx.files.write("/home/user/awatch/deep/two.txt", "2")
            await sbx.files.remove("/home/user/awatch/one.txt")
            try:
                await asyncio.wait_for(got_all.wait(), 15)
            except asyncio.TimeoutError:
                raise AssertionError(f"stream events missing: saw {[(e.type, e.name) for e in events]}")
            await handle.stop()
            # Async commands work on the same sandbox too.
            r = await sbx.commands.run("echo async-ok")
            assert r.stdout == "async-ok\n"
        finally:
            await sbx.kill()

    asyncio.run(main())


# ---- signed URLs with plain HTTP clients (no SDK, no routing headers) ------------------------


def test_upload_and_download_url_plain_http(sandbox, server):
    up = sandbox.upload_url("/home/user/uploads/plain.bin")
    parsed = urllib.parse.urlsplit(up)
    assert f"{parsed.scheme}://{parsed.netloc}" == server.url
    assert parsed.path == "/files"
    q = urllib.parse.parse_qs(parsed.query)
    assert q["path"] == ["/home/user/uploads/plain.bin"]
    assert q["signature"][0].startswith("v1_")

    data = os.urandom(300_000)
    r = requests.post(up, files={"file": ("plain.bin", data)}, proxies=_NO_PROXY, timeout=60)
    assert r.status_code == 200, r.text
    written = r.json()
    assert written and written[0]["path"] == "/home/user/uploads/plain.bin"
    assert bytes(sandbox.files.read("/home/user/uploads/plain.bin", format="bytes")) == data
    assert sandbox.commands.run("stat -c %U /home/user/uploads/plain.bin").stdout == "user\n"

    down = sandbox.download_url("/home/user/uploads/plain.bin")
    r = requests.get(down, proxies=_NO_PROXY, timeout=60)
    assert r.status_code == 200
    assert r.content == data
    # Plain urllib, too.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(down, timeout=60) as resp:
        assert resp.read() == data


def test_signed_urls_are_checked(sandbox):
    sandbox.files.write("/home/user/guarded.txt", "guarded")
    sandbox.files.write("/home/user/hello.txt", "other file")
    down = sandbox.download_url("/home/user/guarded.txt")
    assert requests.get(down, proxies=_NO_PROXY, timeout=30).text == "guarded"
    # Tampered signature.
    bad = down.replace("signature=v1_", "signature=v1_x")
    assert requests.get(bad, proxies=_NO_PROXY, timeout=30).status_code in REFUSED
    # A signature for one path does not open another.
    other = down.replace("guarded.txt", "hello.txt")
    assert requests.get(other, proxies=_NO_PROXY, timeout=30).status_code in REFUSED
    # No signature at all.
    base = down.split("&signature=")[0]
    assert requests.get(base, proxies=_NO_PROXY, timeout=30).status_code in REFUSED
    # Expiring signatures work until they expire.
    exp = sandbox.download_url("/home/user/guarded.txt", use_signature_expiration=2)
    assert requests.get(exp, proxies=_NO_PROXY, timeout=30).text == "guarded"
    time.sleep(3.5)
    assert requests.get(exp, proxies=_NO_PROXY, timeout=30).status_code in REFUSED


def test_download_url_for_root(sandbox):
    sandbox.files.write("/root/r.txt", "root data", user="root")
    url = sandbox.download_url("/root/r.txt", user="root")
    r = requests.get(url, proxies=_NO_PROXY, timeout=30)
    assert r.status_code == 200 and r.text == "root data"
    up = sandbox.upload_url("/root/up.txt", user="root")
    r = requests.post(up, files={"file": ("up.txt", b"uploaded by root")}, proxies=_NO_PROXY, timeout=30)
    assert r.status_code == 200
    assert sandbox.commands.run("cat /root/up.txt; stat -c ' %U' /root/up.txt", user="root").stdout == "uploaded by root root\n"


def test_urls_route_to_the_right_sandbox(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    tag = uuid.uuid4().hex
    a.files.write("/home/user/which.txt", "A" + tag)
    b.files.write("/home/user/which.txt", "B" + tag)
    ra = requests.get(a.download_url("/home/user/which.txt"), proxies=_NO_PROXY, timeout=30)
    rb = requests.get(b.download_url("/home/user/which.txt"), proxies=_NO_PROXY, timeout=30)
    assert (ra.text, rb.text) == ("A" + tag, "B" + tag)
    requests.post(b.upload_url("/home/user/up-b.txt"), files={"file": ("x", b"to-b")}, proxies=_NO_PROXY, timeout=30)
    assert b.files.read("/home/user/up-b.txt") == "to-b"
    assert not a.files.exists("/home/user/up-b.txt")
