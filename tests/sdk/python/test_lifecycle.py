"""Control plane through the current Python SDK: create, get_info, list, set_timeout, connect,
kill, metrics; two sandboxes at once."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid

import pytest
from e2b import (
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from _util import RecordingLogger, aware, now_utc, poll, seconds_until, version_tuple
from bulkhead_testlib import TEMPLATE

ID_RE = re.compile(r"^[a-z0-9]+$")


def _md(run_id, **extra):
    return {"bulkhead-test": run_id, **extra}


def _list_all(query=None, limit=None, order=None):
    pag = Sandbox.list(query=query, limit=limit, order=order)
    items = []
    pages = 0
    while pag.has_next:
        items += pag.next_items()
        pages += 1
        assert pages < 50, "paginator does not terminate (X-Next-Token never empty?)"
    return items


def test_create_uses_v2_endpoint_and_sandbox_works(run_id):
    rec = RecordingLogger("create")
    sbx = Sandbox.create(
        template=TEMPLATE,
        timeout=120,
        metadata=_md(run_id, case="create"),
        envs={"GREETING": "hello from create"},
        logger=rec.logger,
    )
    try:
        assert ID_RE.match(sbx.sandbox_id), sbx.sandbox_id
        assert ("POST", "/v2/sandboxes") in rec.requests(), rec.messages
        assert ("POST", "/sandboxes") not in rec.requests()
        assert sbx.is_running()
        # Create returns only once the sandbox is usable: the very next call goes to the agent.
        r = sbx.commands.run('echo "$GREETING"')
        assert r.stdout == "hello from create\n"
        assert r.exit_code == 0
    finally:
        assert sbx.kill() is True


def test_create_default_template_is_base(run_id):
    if TEMPLATE != "base":
        pytest.skip("suite runs against a non-default template")
    sbx = Sandbox.create(timeout=60, metadata=_md(run_id, case="default-template"))
    try:
        info = sbx.get_info()
        assert "base" in (info.template_id, info.name)
        assert sbx.commands.run("cat /etc/debian_version").stdout.startswith("12")
    finally:
        sbx.kill()


def test_get_info_fields(sandbox_factory, run_id):
    md = {"purpose": "info", "odd": "ünï c=&?/ x"}
    before = now_utc()
    sbx = sandbox_factory(timeout=240, metadata=md)
    after = now_utc()
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert TEMPLATE in (info.template_id, info.name), (info.template_id, info.name)
    assert info.metadata == {**md, "bulkhead-test": run_id}
    started, end = aware(info.started_at), aware(info.end_at)
    assert before.timestamp() - 2 <= started.timestamp() <= after.timestamp() + 2
    assert abs((end - started).total_seconds() - 240) < 5, (started, end)
    assert info.state == SandboxState.RUNNING
    assert info.cpu_count >= 1
    assert info.memory_mb >= 64
    assert version_tuple(info.envd_version) >= (0, 6, 4), info.envd_version
    # The static form answers the same.
    info2 = Sandbox.get_info(sbx.sandbox_id)
    assert info2.sandbox_id == sbx.sandbox_id and info2.metadata == info.metadata


def test_list_metadata_state_filters_and_pagination(sandbox_factory):
    group = uuid.uuid4().hex[:12]
    boxes = [sandbox_factory(timeout=180, metadata={"list-group": group, "idx": str(i)}) for i in range(3)]
    other = sandbox_factory(timeout=180, metadata={"list-group": group + "-other"})
    ids = {b.sandbox_id for b in boxes}

    found = _list_all(SandboxQuery(metadata={"list-group": group}))
    assert {s.sandbox_id for s in found} == ids
    assert other.sandbox_id not in {s.sandbox_id for s in found}
    for s in found:
        assert s.metadata["list-group"] == group
        assert s.state == SandboxState.RUNNING
        assert TEMPLATE in (s.template_id, s.name)
        assert aware(s.started_at) < aware(s.end_at)

    # Two metadata keys must both match.
    one = _list_all(SandboxQuery(metadata={"list-group": group, "idx": "1"}))
    assert [s.sandbox_id for s in one] == [boxes[1].sandbox_id]

    running = _list_all(SandboxQuery(metadata={"list-group": group}, state=[SandboxState.RUNNING]))
    assert {s.sandbox_id for s in running} == ids
    paused = _list_all(SandboxQuery(metadata={"list-group": group}, state=[SandboxState.PAUSED]))
    assert paused == []
    both = _list_all(SandboxQuery(metadata={"list-group": group}, state=[SandboxState.RUNNING, SandboxState.PAUSED]))
    assert {s.sandbox_id for s in both} == ids

    # Pagination: limit 2 → a full page with a next token, then the rest, then no token.
    pag = Sandbox.list(query=SandboxQuery(metadata={"list-group": group}), limit=2)
    page1 = pag.next_items()
    assert len(page1) == 2
    assert pag.has_next and pag.next_token
    page2 = pag.next_items()
    assert len(page2) == 1
    assert not pag.has_next
    assert {s.sandbox_id for s in page1 + page2} == ids

    # Order by start time.
    asc = _list_all(SandboxQuery(metadata={"list-group": group}), order="asc")
    desc = _list_all(SandboxQuery(metadata={"list-group": group}), order="desc")
    assert [s.started_at for s in asc] == sorted(s.started_at for s in asc)
    assert [s.started_at for s in desc] == sorted((s.started_at for s in desc), reverse=True)

    # A killed sandbox leaves the list.
    boxes[0].kill()
    after = _list_all(SandboxQuery(metadata={"list-group": group}))
    assert {s.sandbox_id for s in after} == ids - {boxes[0].sandbox_id}


def test_list_metadata_filter_with_special_characters(sandbox_factory):
    # The SDK URL-encodes each key and value, then the whole `k=v&…` string again: the server
    # must decode twice (as E2B's API does).
    tag = uuid.uuid4().hex[:8]
    md = {"odd key/ü": f"v a/l=u&e ü+%20 {tag}"}
    sbx = sandbox_factory(metadata=md)
    sandbox_factory(metadata={"odd key/ü": f"other {tag}"})
    found = _list_all(SandboxQuery(metadata=md))
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
    assert found[0].metadata["odd key/ü"] == md["odd key/ü"]


def test_set_timeout_moves_end_at_both_ways(sandbox_factory):
    sbx = sandbox_factory(timeout=60)
    end0 = aware(sbx.get_info().end_at)
    sbx.set_timeout(600)
    end1 = aware(sbx.get_info().end_at)
    assert end1 > end0
    assert abs(seconds_until(end1) - 600) < 10
    # set_timeout may also shorten (unlike connect).
    sbx.set_timeout(45)
    end2 = aware(sbx.get_info().end_at)
    assert abs(seconds_until(end2) - 45) < 10
    # The static form works too.
    Sandbox.set_timeout(sbx.sandbox_id, 120)
    assert abs(seconds_until(aware(Sandbox.get_info(sbx.sandbox_id).end_at)) - 120) < 10
    assert sbx.is_running()


def test_short_timeout_sandbox_is_really_gone(run_id):
    t0 = time.monotonic()
    sbx = Sandbox.create(template=TEMPLATE, timeout=3, metadata=_md(run_id, case="ttl"))
    try:
        assert sbx.commands.run("echo alive").stdout == "alive\n"
        time.sleep(max(0.0, 5 - (time.monotonic() - t0)))
        assert poll(lambda: not sbx.is_running(), timeout=3), "sandbox still running after its 3 s timeout"
        assert time.monotonic() - t0 < 10
        with pytest.raises(SandboxNotFoundException):
            sbx.get_info()
        with pytest.raises(SandboxException):
            sbx.commands.run("echo should-not-run", timeout=10)
        assert sbx.sandbox_id not in {s.sandbox_id for s in _list_all(SandboxQuery(metadata=_md(run_id, case="ttl")))}
    finally:
        sbx.kill()


def test_set_timeout_shorter_kills(sandbox_factory):
    sbx = sandbox_factory(timeout=300)
    sbx.set_timeout(2)
    assert poll(lambda: not sbx.is_running(), timeout=10)
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()


def test_connect_by_id_extends_never_shortens(sandbox_factory):
    sbx = sandbox_factory(timeout=60)
    sbx.files.write("/home/user/connect-marker.txt", "same sandbox")
    rec = RecordingLogger("connect")
    other = Sandbox.connect(sbx.sandbox_id, timeout=600, logger=rec.logger)
    assert ("POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect") in rec.requests(), rec.messages
    assert other.sandbox_id == sbx.sandbox_id
    assert other.files.read("/home/user/connect-marker.txt") == "same sandbox"
    assert other.commands.run("echo via-connect").stdout == "via-connect\n"
    end_long = aware(sbx.get_info().end_at)
    assert abs(seconds_until(end_long) - 600) < 10, "connect(timeout=600) must extend the TTL"

    # A shorter timeout on connect never shortens a running sandbox's TTL.
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    end_after = aware(sbx.get_info().end_at)
    assert end_after >= end_long - dt.timedelta(seconds=1), (end_long, end_after)

    # Instance form.
    assert sbx.connect(timeout=30) is sbx
    assert aware(sbx.get_info().end_at) >= end_long - dt.timedelta(seconds=1)


def test_connect_unknown_sandbox_is_not_found(server):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("doesnotexist0000000000", timeout=30)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("doesnotexist0000000000")
    assert Sandbox.kill("doesnotexist0000000000") is False


def test_kill_then_everything_is_not_found(sandbox_factory):
    sbx = sandbox_factory(timeout=120)
    sid = sbx.sandbox_id
    assert sbx.kill() is True
    assert sbx.kill() is False
    assert Sandbox.kill(sid) is False
    assert sbx.is_running() is False
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()
    with pytest.raises(NotFoundException):
        sbx.set_timeout(30)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sid, timeout=30)
    with pytest.raises(SandboxException):
        sbx.commands.run("echo ghost", timeout=10)
    with pytest.raises(SandboxException):
        sbx.files.read("/etc/hostname")
    assert sid not in {s.sandbox_id for s in _list_all()}


def test_metrics_are_real(sandbox):
    sandbox.commands.run("python3 -c 'x = bytearray(32 << 20); print(len(x))'")
    metrics = poll(lambda: sandbox.get_metrics(), timeout=20, interval=1)
    assert metrics, "get_metrics returned no samples within 20 s"
    m = metrics[-1]
    assert m.cpu_count >= 1
    assert m.mem_total > 0
    assert 0 < m.mem_used <= m.mem_total
    assert m.cpu_used_pct >= 0
    assert m.disk_total >= m.disk_used >= 0


def test_envs_at_create_and_per_command_override(sandbox_factory):
    sbx = sandbox_factory(envs={"SBX_VAR": "from-create", "SHARED": "create"})
    assert sbx.commands.run('echo "$SBX_VAR $SHARED"').stdout == "from-create create\n"
    r = sbx.commands.run('echo "$SBX_VAR $SHARED"', envs={"SHARED": "command"})
    assert r.stdout == "from-create command\n"


def test_two_sandboxes_at_once_are_separate(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    assert a.sandbox_id != b.sandbox_id
    a.files.write("/home/user/only-in-a.txt", "A")
    a.commands.run("echo a-tmp > /tmp/a-tmp.txt")
    assert not b.files.exists("/home/user/only-in-a.txt")
    assert not b.files.exists("/tmp/a-tmp.txt")
    b.files.write("/home/user/shared-name.txt", "B-content")
    a.files.write("/home/user/shared-name.txt", "A-content")
    assert a.files.read("/home/user/shared-name.txt") == "A-content"
    assert b.files.read("/home/user/shared-name.txt") == "B-content"

    # Commands in both at the same time.
    results = {}

    def run(name, sbx):
        results[name] = sbx.commands.run(f'sleep 1; echo "{name}:$(cat /home/user/shared-name.txt)"')

    threads = [threading.Thread(target=run, args=(n, s)) for n, s in (("a", a), ("b", b))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results["a"].stdout == "a:A-content\n"
    assert results["b"].stdout == "b:B-content\n"
    assert time.monotonic() - t0 < 15
