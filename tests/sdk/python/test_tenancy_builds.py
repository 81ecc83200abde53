"""Template builds count against their team (issue 22, row 11), with the official SDK against a
server of its own (`--max-builds-per-team 2`): a team limited to 1 vCPU and 256 MiB per sandbox
cannot get a 64-vCPU or 64 GiB build sandbox (refused at the build request, before anything
runs), a build within its quotas still works, a team's third concurrent build is refused with
a 429 while its first two run, and another team's builds are not held up by it.

Every sandbox is killed through the API, with each team's key, before the server stops."""

from __future__ import annotations

import time
import uuid

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException, RateLimitException

from bulkhead_testlib import TEMPLATE, own_server
from test_teams import Cli, new_team


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def bserver(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs servers started by the suite (it starts and kills its own)")
    with own_server(
        [
            "--templates",
            TEMPLATE,
            "--uid-base",
            "310000000",
            "--pool-size",
            "0",
            "--max-builds-per-team",
            "2",
        ]
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_team(bserver):
    name = f"small-{uuid.uuid4().hex[:6]}"
    key = new_team(bserver, name)
    Cli(bserver)("teams", "set-quota", name, "--max-vcpus", "1", "--max-memory-mb", "256")
    return key


def _wait_build(info, key: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = Template.get_build_status(info, api_key=key)
        status = str(getattr(st.status, "value", st.status))
        if status in ("ready", "error"):
            return status
        time.sleep(1)
    raise AssertionError(f"build {info.build_id} did not finish in {timeout} s")


def test_a_build_larger_than_the_teams_quota_is_refused(bserver, small_team):
    t = Template().from_template(TEMPLATE).run_cmd("echo built > /home/user/m")
    with pytest.raises(BuildException) as e:
        Template.build(t, _name("too-many-cpus"), cpu_count=64, memory_mb=256, api_key=small_team)
    assert "64 vCPUs" in str(e.value) and "at most 1" in str(e.value), str(e.value)
    with pytest.raises(BuildException) as e:
        Template.build(t, _name("too-much-mem"), cpu_count=1, memory_mb=65536, api_key=small_team)
    assert "65536 MiB" in str(e.value) and "256" in str(e.value), str(e.value)

    # Within the quotas, the same team builds and starts its template.
    name = _name("fits")
    Template.build(t, name, cpu_count=1, memory_mb=256, api_key=small_team)
    sbx = Sandbox.create(name, api_key=small_team, timeout=60)
    try:
        assert sbx.commands.run("cat /home/user/m").stdout == "built\n"
    finally:
        sbx.kill()


def test_a_teams_third_concurrent_build_is_refused_while_others_build(bserver):
    key = new_team(bserver, f"busy-{uuid.uuid4().hex[:6]}")
    # Unique per run: a step the shared image cache already holds would finish at once.
    slow = Template().from_template(TEMPLATE).run_cmd(f"sleep 20 && echo slow-{uuid.uuid4().hex} > /home/user/s")
    first = Template.build_in_background(slow, _name("slow-a"), api_key=key)
    second = Template.build_in_background(slow, _name("slow-b"), api_key=key)
    try:
        with pytest.raises(RateLimitException) as e:
            Template.build_in_background(slow, _name("slow-c"), api_key=key, retries=0)
        assert "already runs 2 template builds" in str(e.value), str(e.value)

        # Another team is not held up by this one's limit.
        other = Template().from_template(TEMPLATE).run_cmd("echo other > /home/user/o")
        Template.build(other, _name("other-team"), api_key=bserver.api_key)
    finally:
        assert _wait_build(first, key) == "ready"
        assert _wait_build(second, key) == "ready"

    # The places are free again once those builds ended.
    Template.build(Template().from_template(TEMPLATE).run_cmd("true"), _name("after"), api_key=key)
