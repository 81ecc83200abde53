"""Every sandbox's disk is its own (issue 22, row 12; issue 23, item 1), through the official SDK:

- on a server started with `--sandbox-disk-mb 64`, a sandbox that writes 100 MiB, then 6,000 files,
  gets "No space left on device" inside for both (the host's disk is never the one that fills),
  runs on, and can write again what it freed; `diskSizeMB` and the metrics say 64 MiB;
- a snapshot of a *paused* sandbox is as good as one of a running sandbox: owners, modes,
  set-uid bits, nanosecond mtimes, a deleted template file and a file a process holds open for
  writing all come back, in the snapshot's sandboxes and in the resumed original.

Every sandbox is killed and every snapshot deleted through the API."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.sandbox.commands.command_handle import CommandExitException

from _util import poll
from bulkhead_testlib import TEMPLATE, http, own_server

DISK_MB = 64


@pytest.fixture(scope="module")
def small_disks(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs servers started by the suite (it starts and kills its own)")
    args = ["--templates", TEMPLATE, "--uid-base", "320000000", "--pool-size", "0"]
    with own_server(args + ["--sandbox-disk-mb", str(DISK_MB)]) as srv:
        yield srv


def _fails(sbx: Sandbox, cmd: str) -> str:
    """Run `cmd` as root; it must fail. Returns its stderr."""
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run(cmd, user="root", timeout=120)
    return e.value.stderr


def test_a_sandbox_cannot_write_past_its_disk(small_disks):
    srv = small_disks
    sbx = Sandbox.create(TEMPLATE, timeout=300)
    try:
        detail = http("GET", f"{srv.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": srv.api_key})
        assert detail.status == 200, detail.text
        assert detail.json()["diskSizeMB"] == DISK_MB

        err = _fails(sbx, "dd if=/dev/zero of=/home/user/big bs=1M count=100")
        assert "No space left on device" in err, err
        m = poll(lambda: sbx.get_metrics() or None, timeout=30)
        assert m[-1].disk_total <= DISK_MB << 20, m[-1]
        assert m[-1].disk_used > 40 << 20, m[-1]

        # 64 MiB holds 4,096 inodes: the 6,000th file cannot be made.
        err = _fails(
            sbx,
            "rm /home/user/big; mkdir /home/user/many; cd /home/user/many; "
            "i=0; while [ $i -lt 6000 ]; do touch f$i || exit 1; i=$((i+1)); done",
        )
        assert "No space left on device" in err, err
        made = int(sbx.commands.run("ls /home/user/many | wc -l").stdout)
        assert 3000 < made < 4096, made

        # The sandbox runs on, and what it frees it can use again.
        sbx.commands.run("rm -rf /home/user/many && dd if=/dev/zero of=/home/user/again bs=1M count=32", user="root")
        assert sbx.commands.run("stat -c %s /home/user/again").stdout.strip() == str(32 << 20)
    finally:
        sbx.kill()


SETUP = """
set -e
cp /bin/true /home/user/suid-true && chmod 4755 /home/user/suid-true
echo private > /home/user/private && chown user:user /home/user/private && chmod 0640 /home/user/private
touch -d '2020-01-02 03:04:05.123456789' /home/user/private
rm /etc/issue
"""
STAT = "stat -c '%U:%G %a %y' /home/user/suid-true /home/user/private"


def _check_files(sbx: Sandbox, expected_stat: str):
    assert sbx.commands.run(STAT).stdout == expected_stat
    assert sbx.commands.run("test ! -e /etc/issue && echo gone").stdout == "gone\n"
    # The owner reads its own file as itself; the set-uid binary still runs.
    assert sbx.commands.run("cat /home/user/private", user="user").stdout == "private\n"
    sbx.commands.run("/home/user/suid-true", user="user")
    # The writer restored with memory keeps appending to the file it holds open.
    size = lambda: int(sbx.commands.run("stat -c %s /home/user/open.log").stdout)  # noqa: E731
    first = size()
    poll(lambda: size() > first, timeout=20)


def test_a_snapshot_of_a_paused_sandbox_keeps_every_file_as_it_was(sandbox_factory):
    sbx = sandbox_factory(timeout=300)
    assert sbx.commands.run("test -e /etc/issue && echo yes").stdout == "yes\n", "the template has /etc/issue"
    sbx.commands.run(SETUP, user="root")
    sbx.commands.run(
        "sh -c 'exec 3>>/home/user/open.log; while true; do echo tick >&3; sleep 0.2; done'",
        background=True,
    )
    poll(lambda: sbx.commands.run("test -s /home/user/open.log && echo y || true").stdout == "y\n", timeout=20)
    expected = sbx.commands.run(STAT).stdout
    assert "4755" in expected and "0640" not in expected and ".123456789" in expected, expected

    assert sbx.pause() is True
    snap = sbx.create_snapshot()
    try:
        for _ in range(2):
            copy = Sandbox.create(snap.snapshot_id, timeout=120)
            try:
                _check_files(copy, expected)
            finally:
                copy.kill()
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
        _check_files(resumed, expected)
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_tmp_is_on_the_disk_and_comes_back_exactly_as_written(sandbox_factory):
    """`/tmp` as on E2B (issue 23, item 7): on the sandbox's disk, not a tmpfs; a memory pause
    brings its files back with their exact mtimes, and a filesystem-only pause keeps them."""
    sbx = sandbox_factory(timeout=300)
    assert sbx.commands.run("stat -f -c %T /tmp").stdout.strip() != "tmpfs"
    sbx.commands.run("head -c 100000 /dev/urandom > /tmp/data && touch -d '2022-02-03 04:05:06.987654321' /tmp/data")
    look = "md5sum /tmp/data; stat -c '%s %y' /tmp/data"
    before = sbx.commands.run(look).stdout
    assert ".987654321" in before, before

    assert sbx.pause() is True
    sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert sbx.commands.run(look).stdout == before, "after a memory pause"

    assert sbx.pause(mode="filesystem") is True
    sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert sbx.commands.run(look).stdout == before, "after a filesystem-only pause"
