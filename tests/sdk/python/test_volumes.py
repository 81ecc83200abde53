"""Volumes with the official SDK: `Volume.create/list/connect/destroy`, the volume content
client (`E2B_VOLUME_API_URL` pointed at Bulkhead), `Sandbox.create(volume_mounts=...)` in two
sandboxes at once, data after kills and a server restart, the size limit, and escape attempts.

These tests run against a server of their own (a small `--volume-max-bytes`, restarted freely),
started and stopped by the module fixture; every sandbox it made is killed through the API
before it stops."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import NotFoundException, SandboxException, VolumeException

from bulkhead_testlib import TEMPLATE, http, kill_quietly, own_server

LIMIT = 32 << 20


@pytest.fixture(scope="module")
def vserver(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs servers started by the suite (it starts and restarts its own)")
    with own_server(
        [
            "--volume-max-bytes",
            str(LIMIT),
            "--uid-base",
            "200000000",
            "--max-sandboxes",
            "16",
            "--pool-size",
            "0",
        ]
    ) as srv:
        try:
            yield srv
        finally:
            # Volumes outlive sandboxes: removed through the API before the server stops.
            srv.ensure_running()
            srv.kill_all_sandboxes()
            for v in Volume.list():
                Volume.destroy(v.volume_id)


@pytest.fixture
def sandboxes(vserver):
    made = []

    def make(**kw):
        sbx = Sandbox.create(template=TEMPLATE, timeout=300, **kw)
        made.append(sbx)
        return sbx

    yield make
    kill_quietly(made)


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


def test_volume_crud(vserver):
    name = unique("crud")
    vol = Volume.create(name)
    assert vol.name == name and vol.volume_id and vol.token
    assert name in [v.name for v in Volume.list()]
    again = Volume.connect(vol.volume_id)
    assert (again.name, again.token) == (name, vol.token)
    info = Volume.get_info(vol.volume_id)
    assert info.name == name

    with pytest.raises(Exception) as dup:
        Volume.create(name)
    assert "already exists" in str(dup.value)
    for bad in ["", "has space", "../x", "x" * 64, "-lead"]:
        with pytest.raises(Exception) as e:
            Volume.create(bad)
        assert "Invalid volume name" in str(e.value), bad

    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_content_operations(vserver):
    vol = Volume.create(unique("content"))
    try:
        st = vol.write_file("/docs/readme.txt", "hello volume", force=True)
        assert (st.name, st.path, st.size, st.type.value) == ("readme.txt", "/docs/readme.txt", 12, "file")
        assert (st.uid, st.gid) == (1000, 1000)
        assert vol.read_file("/docs/readme.txt") == "hello volume"
        assert vol.read_file("docs/readme.txt", format="bytes") == b"hello volume"
        assert b"".join(vol.read_file("/docs/readme.txt", format="stream")) == b"hello volume"

        d = vol.make_dir("/a/b/c", force=True)
        assert d.type.value == "directory"
        with pytest.raises(Exception):
            vol.make_dir("/x/y")  # no parent without force
        vol.write_file("/a/b/c/data.bin", b"\x00\x01\x02", mode=0o600)
        top = vol.list("/")
        assert [e.path for e in top] == ["/a", "/docs"]
        deep = vol.list("/a", depth=3)
        assert [e.path for e in deep] == ["/a/b", "/a/b/c", "/a/b/c/data.bin"]
        info = vol.get_info("/a/b/c/data.bin")
        assert (info.size, info.mode) == (3, 0o600)
        assert vol.exists("/docs") and not vol.exists("/nope")
        up = vol.update_metadata("/a/b/c/data.bin", mode=0o640)
        assert up.mode == 0o640

        # Writing without `force` into a missing directory fails; overwriting works.
        with pytest.raises(Exception):
            vol.write_file("/missing/f.txt", "x")
        vol.write_file("/docs/readme.txt", "v2")
        assert vol.read_file("/docs/readme.txt") == "v2"

        vol.remove("/a")
        assert not vol.exists("/a/b/c/data.bin")
        with pytest.raises(NotFoundException):
            vol.read_file("/a/b/c/data.bin")
        with pytest.raises(NotFoundException):
            vol.remove("/a")

        # Paths that leave the volume are refused before touching the disk.
        for bad in ["../etc/passwd", "/docs/../../etc/passwd", "a\0b"]:
            with pytest.raises(Exception) as e:
                vol.read_file(bad)
            assert "Invalid path" in str(e.value) or "not found" in str(e.value).lower(), bad

        # Another volume's token does not open this one; no token at all is refused.
        other = Volume.create(unique("other"))
        try:
            forged = Volume(vol.volume_id, vol.name, token=other.token)
            with pytest.raises(Exception):
                forged.read_file("/docs/readme.txt")
            r = http("GET", f"{vserver.url}/volumecontent/{vol.volume_id}/path?path=/docs")
            assert r.status == 401, r.body
            # The API key of the team also works (Bulkhead extension for operators).
            r = http("GET", f"{vserver.url}/volumecontent/{vol.volume_id}/path?path=/docs", headers=vserver.api_headers())
            assert r.status == 200, r.body
        finally:
            Volume.destroy(other.volume_id)
    finally:
        Volume.destroy(vol.volume_id)


def test_two_sandboxes_share_a_volume_and_data_persists(vserver, sandboxes):
    vol = Volume.create(unique("shared"))
    a = sandboxes(volume_mounts={"/mnt/data": vol})
    b = sandboxes(volume_mounts={"/home/user/shared": vol.name})

    assert [(m["name"], m["path"]) for m in b.get_info().volume_mounts] == [(vol.name, "/home/user/shared")]
    a.files.write("/mnt/data/from-a.txt", "written by a")
    assert b.files.read("/home/user/shared/from-a.txt") == "written by a"
    r = b.commands.run("echo from-b > /home/user/shared/from-b.txt && id -u && stat -c %u:%g /home/user/shared/from-b.txt")
    assert r.stdout.split() == ["1000", "1000:1000"]
    assert a.commands.run("cat /mnt/data/from-b.txt").stdout == "from-b\n"
    # Root inside writes too; ids are the same in both sandboxes and on the host.
    a.commands.run("echo root > /mnt/data/root.txt", user="root")
    assert b.commands.run("stat -c %u /home/user/shared/root.txt").stdout.strip() == "0"
    host = vserver.data_dir / "volumes" / vol.volume_id / "mnt"
    assert (host / "from-b.txt").stat().st_uid == 1000
    assert (host / "root.txt").stat().st_uid == 0
    # The content API sees what the sandboxes wrote, and they see what it writes.
    assert vol.read_file("/from-b.txt") == "from-b\n"
    vol.write_file("/from-api.txt", "api")
    assert a.files.read("/mnt/data/from-api.txt") == "api"
    # The mount point is not a change of the sandbox; the volume's files are not either.
    r = http("GET", f"{vserver.url}/sandboxes/{a.sandbox_id}/changes", headers=vserver.api_headers())
    assert r.status == 200, r.body
    assert not [c for c in r.json() if c["path"].startswith("/mnt/data")], r.json()
    opts = a.commands.run("grep ' /mnt/data ' /proc/self/mountinfo").stdout
    assert "nosuid" in opts and "nodev" in opts, opts

    # A mounted volume cannot be deleted.
    with pytest.raises(Exception) as e:
        Volume.destroy(vol.volume_id)
    assert "mounted" in str(e.value)

    a.kill()
    b.kill()
    assert vol.read_file("/from-a.txt") == "written by a"
    vserver.restart()
    assert vol.read_file("/from-a.txt") == "written by a"
    c = sandboxes(volume_mounts={"/data": vol})
    assert c.files.read("/data/from-b.txt") == "from-b\n"
    c.kill()
    assert Volume.destroy(vol.volume_id) is True
    assert not (vserver.data_dir / "volumes" / vol.volume_id).exists()


def test_size_limit_inside_and_through_the_api(vserver, sandboxes):
    vol = Volume.create(unique("limit"))
    try:
        sbx = sandboxes(volume_mounts={"/mnt/v": vol})
        r = sbx.commands.run("dd if=/dev/zero of=/mnt/v/big bs=1M count=48 2>&1; echo rc=$?", timeout=120)
        assert "No space left" in r.stdout, r.stdout
        sbx.commands.run("rm -f /mnt/v/big")
        sbx.kill()
        with pytest.raises(Exception) as e:
            vol.write_file("/big.bin", b"\0" * (48 << 20))
        assert "full" in str(e.value).lower(), str(e.value)
        # Still usable after hitting the limit.
        vol.remove("/big.bin")
        vol.write_file("/small.txt", "ok")
        assert vol.read_file("/small.txt") == "ok"
    finally:
        Volume.destroy(vol.volume_id)


def _sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_escape_attempts(vserver, sandboxes):
    vol = Volume.create(unique("escape"))
    before = {p: _sha(p) for p in ("/etc/passwd", "/etc/hostname")}
    try:
        # Mount paths the engine refuses.
        for path in ["/", "relative", "/proc/x", "/sys", "/dev/shm", "/run/bulkhead", "/a/../b", "/etc/hostname", "/bin/x"]:
            with pytest.raises(SandboxException) as e:
                Sandbox.create(template=TEMPLATE, timeout=60, volume_mounts={path: vol})
            assert "Invalid volume mount" in str(e.value), path
        with pytest.raises(Exception) as e:
            Sandbox.create(template=TEMPLATE, timeout=60, volume_mounts={"/mnt/x": "no-such-volume"})
        assert "not found" in str(e.value)

        sbx = sandboxes(volume_mounts={"/mnt/v": vol})
        plant = (
            "ln -s /etc/passwd /mnt/v/passwd && ln -s / /mnt/v/root && ln -s ../../../../etc /mnt/v/up"
            " && ln -s /proc/self/root /mnt/v/magic && mkdir /mnt/v/d && ln -s /etc/hostname /mnt/v/d/h"
        )
        assert sbx.commands.run(plant, user="root").exit_code == 0
        sbx.kill()
        # The content API never follows them out of the volume.
        for p in ["/passwd", "/root/etc/passwd", "/up/passwd", "/magic/etc/passwd", "/d/h"]:
            with pytest.raises(Exception) as e:
                vol.read_file(p)
            assert "outside the volume" in str(e.value) or "Invalid path" in str(e.value), (p, str(e.value))
        for p in ["/passwd", "/d/h"]:
            with pytest.raises(Exception):
                vol.write_file(p, "pwned")
        for p in ["/root/tmp/pwned", "/up/pwned"]:
            with pytest.raises(Exception):
                vol.write_file(p, "pwned", force=True)
        with pytest.raises(Exception):
            vol.list("/root")
        info = vol.get_info("/passwd")
        assert (info.type.value, info.target) == ("symlink", "/etc/passwd")
        vol.update_metadata("/passwd", mode=0o777)  # changes the link, not its target
        vol.remove("/root")  # removes the link, never walks the host root
        assert Path("/etc/passwd").exists()

        # Another sandbox following the planted links stays inside itself.
        other = sandboxes(volume_mounts={"/mnt/v": vol})
        r = other.commands.run("cat /mnt/v/d/h; ls /mnt/v/up/ | head -3", user="root")
        assert r.stdout.split("\n")[0] == other.commands.run("cat /etc/hostname").stdout.strip()
        other.kill()
        assert {p: _sha(p) for p in before} == before
    finally:
        Volume.destroy(vol.volume_id)


# "full": CRIU restores the processes and the jail re-attaches each volume as an idmapped,
# writable view for the new slot (its files keep their owners and the sandbox's user can write).
@pytest.mark.parametrize("mode", ["filesystem", "full"])
def test_volumes_come_back_after_pause_and_resume(vserver, sandboxes, mode):
    if not os.environ.get("BULKHEAD_CRIU"):
        pytest.skip("SKIPPED: pause needs CRIU (BULKHEAD_CRIU, set by scripts/test.sh)")
    vol = Volume.create(unique(f"pause-{mode}"))
    try:
        sbx = sandboxes(volume_mounts={"/mnt/v": vol})
        sbx.files.write("/mnt/v/before.txt", "before the pause")
        assert sbx.pause(mode=mode)
        # Paused: the volume is still in use, and still readable through the API.
        with pytest.raises(Exception) as e:
            Volume.destroy(vol.volume_id)
        assert "mounted" in str(e.value)
        vol.write_file("/while-paused.txt", "written while paused")
        again = Sandbox.connect(sbx.sandbox_id)
        r = again.commands.run("cat /mnt/v/before.txt /mnt/v/while-paused.txt")
        assert r.stdout == "before the pausewritten while paused", r.stdout
        again.files.write("/mnt/v/after.txt", "after")
        assert vol.read_file("/after.txt") == "after"
        owner = again.commands.run("stat -c %u:%g /mnt/v/before.txt /mnt/v/after.txt").stdout
        assert owner.split() == ["1000:1000", "1000:1000"], owner
        again.kill()
    finally:
        Volume.destroy(vol.volume_id)
