"""Teams, quotas, rate limits, credits and metering with the official SDK, against a server of
its own (a 1 s metering interval, a price per vCPU-hour, no credits grace): two teams do not
see each other's sandboxes; a quota refusal and the create rate limit raise the SDK's errors
with Bulkhead's message; a team out of credits is refused creates (402) and its running
sandbox is paused; `GET /bulkhead/v1/usage` reports plausible vCPU-seconds; and a kill -9 of
the server loses at most one metering interval.

Teams and keys are made with the `bulkhead` CLI on the server's data dir while it runs (as an
operator would). Every sandbox is killed through the API, with each team's key, before the
server stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, RateLimitException, SandboxException

from bulkhead_testlib import TEMPLATE, BulkheadServer, http, own_server

# 3600 credits per vCPU-hour: one credit per vCPU-second (a base sandbox has 2 vCPUs).
PRICE_VCPU_HOUR = 3600
INTERVAL_S = 1.0


class Cli:
    def __init__(self, srv: BulkheadServer):
        self.srv = srv

    def __call__(self, *args: str) -> str:
        binary = self.srv._argv[0]
        r = subprocess.run(
            [binary, *args, "--data-dir", str(self.srv.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, f"bulkhead {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout


@pytest.fixture(scope="module")
def tserver(server):
    if not server.owned:
        pytest.skip("SKIPPED: needs servers started by the suite (it starts and kills its own)")
    with own_server(
        [
            "--templates",
            TEMPLATE,
            "--uid-base",
            "300000000",
            "--pool-size",
            "0",
            "--metering-interval",
            str(INTERVAL_S),
            "--price-vcpu-hour",
            str(PRICE_VCPU_HOUR),
            "--credits-grace",
            "0",
        ]
    ) as srv:
        yield srv


def _list_all(srv: BulkheadServer, key: str):
    r = http("GET", f"{srv.url}/v2/sandboxes?state=running&state=paused&limit=100", headers={"X-API-Key": key})
    return [s["sandboxID"] for s in r.json()] if r.status == 200 else []


def new_team(srv: BulkheadServer, name: str, *extra: str) -> str:
    cli = Cli(srv)
    cli("teams", "create", name, *extra)
    key = cli("keys", "create", "--team", name, "--name", f"{name}-key").strip()
    srv.team_keys.append(key)
    return key


def usage(srv: BulkheadServer, key: str, **q) -> dict:
    qs = "&".join(f"{k}={v}" for k, v in q.items())
    r = http("GET", f"{srv.url}/bulkhead/v1/usage?{qs}", headers={"X-API-Key": key})
    assert r.status == 200, (r.status, r.body)
    return r.json()


def test_teams_do_not_see_each_others_sandboxes(tserver):
    key_a = tserver.api_key
    key_b = new_team(tserver, "iso-b")
    sa = Sandbox.create(TEMPLATE, timeout=120, api_key=key_a)
    sb = Sandbox.create(TEMPLATE, timeout=120, api_key=key_b)
    try:
        ids_b = [s.sandbox_id for s in Sandbox.list(api_key=key_b).next_items()]
        ids_a = [s.sandbox_id for s in Sandbox.list(api_key=key_a).next_items()]
        assert sb.sandbox_id in ids_b and sa.sandbox_id not in ids_b, ids_b
        assert sa.sandbox_id in ids_a and sb.sandbox_id not in ids_a, ids_a
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sa.sandbox_id, api_key=key_b)
        with pytest.raises(NotFoundException):
            Sandbox.connect(sa.sandbox_id, api_key=key_b)
        assert Sandbox.kill(sa.sandbox_id, api_key=key_b) is False
        # Still alive and usable by its own team.
        assert sa.commands.run("echo ok").stdout == "ok\n"
        # A second key of team b sees team b's sandbox: sandboxes are the team's.
        key_b2 = Cli(tserver)("keys", "create", "--team", "iso-b").strip()
        assert Sandbox.get_info(sb.sandbox_id, api_key=key_b2).sandbox_id == sb.sandbox_id
        # Usage is team-scoped too, whatever the query names.
        other = usage(tserver, key_b, sandbox_id=sa.sandbox_id)
        assert other["sandboxes"] == [], other
    finally:
        sa.kill()
        sb.kill()


def test_quota_refusal_raises_the_sdk_error_with_the_limit(tserver):
    key = new_team(tserver, "quota-b")
    cli = Cli(tserver)
    cli("teams", "set-quota", "quota-b", "--max-vcpus", "1")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(TEMPLATE, timeout=60, api_key=key)
    msg = str(e.value)
    assert msg.startswith("403: "), msg
    assert "at most 1 per sandbox" in msg and "bulkhead teams set-quota quota-b --max-vcpus 2" in msg, msg
    cli("teams", "set-quota", "quota-b", "--max-vcpus", "none", "--max-timeout", "30")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(TEMPLATE, timeout=60, api_key=key)
    assert "403: " in str(e.value) and "--max-timeout 60" in str(e.value), str(e.value)
    cli("teams", "set-quota", "quota-b", "--max-timeout", "none", "--max-sandboxes", "1")
    s1 = Sandbox.create(TEMPLATE, timeout=60, api_key=key)
    try:
        with pytest.raises(RateLimitException) as e:
            Sandbox.create(TEMPLATE, timeout=60, api_key=key)
        assert "its limit is 1" in str(e.value), str(e.value)
    finally:
        s1.kill()
    # The raw answer is E2B's error shape.
    r = http("POST", f"{tserver.url}/v2/sandboxes", {"templateID": TEMPLATE, "timeout": 60}, headers={"X-API-Key": key})
    if r.status == 201:
        http("DELETE", f"{tserver.url}/sandboxes/{r.json()['sandboxID']}", headers={"X-API-Key": key})
    cli("teams", "set-quota", "quota-b", "--max-vcpus", "1")
    r = http("POST", f"{tserver.url}/v2/sandboxes", {"templateID": TEMPLATE, "timeout": 60}, headers={"X-API-Key": key})
    assert r.status == 403 and r.json()["code"] == 403 and "--max-vcpus" in r.json()["message"], (r.status, r.body)


def test_create_rate_limit_is_a_429(tserver):
    key = new_team(tserver, "rate-b")
    Cli(tserver)("teams", "set-quota", "rate-b", "--creates-per-second", "0.01", "--create-burst", "1")
    s1 = Sandbox.create(TEMPLATE, timeout=60, api_key=key)
    try:
        with pytest.raises(RateLimitException) as e:
            Sandbox.create(TEMPLATE, timeout=60, api_key=key)
        assert "429" in str(e.value) and "faster than its limit of 0.01 per second" in str(e.value), str(e.value)
        assert "--creates-per-second" in str(e.value)
    finally:
        s1.kill()


def test_credits_run_out_create_refused_and_sandbox_paused(tserver):
    # 20 credits: a 2-vCPU sandbox at one credit per vCPU-second spends them in ~10 s.
    key = new_team(tserver, "credit-b", "--credits", "20")
    t0 = time.time()
    sbx = Sandbox.create(TEMPLATE, timeout=300, api_key=key)
    try:
        sbx.files.write("/home/user/keep.txt", "kept across the pause")
        deadline = time.monotonic() + 90
        state = None
        while time.monotonic() < deadline:
            state = Sandbox.get_info(sbx.sandbox_id, api_key=key).state
            if str(getattr(state, "value", state)) == "paused":
                break
            time.sleep(0.5)
        assert str(getattr(state, "value", state)) == "paused", f"still {state} after the credits ran out"
        elapsed = time.time() - t0
        with pytest.raises(SandboxException) as e:
            Sandbox.create(TEMPLATE, timeout=60, api_key=key)
        msg = str(e.value)
        assert msg.startswith("402: ") and "no credits left" in msg and "bulkhead teams credit credit-b +N" in msg, msg
        assert getattr(e.value, "status_code", None) == 402

        # Usage: ~10 running seconds at 2 vCPUs, and the balance at or below zero.
        u = usage(tserver, key)
        assert len(u["sandboxes"]) == 1, u
        s = u["sandboxes"][0]
        assert s["sandbox_id"] == sbx.sandbox_id and s["team_id"].startswith("team_")
        assert 8 <= s["running_seconds"] <= elapsed + 1, (s, elapsed)
        assert abs(s["vcpu_seconds"] - 2 * s["running_seconds"]) < 0.01, s
        assert abs(s["memory_gib_seconds"] - 0.5 * s["running_seconds"]) < 0.01, s
        assert u["credits"] <= 0, u
        assert abs(u["totals"]["cost"] - s["vcpu_seconds"]) < 0.01, u

        # A top-up lets the team resume: nothing was lost.
        Cli(tserver)("teams", "credit", "credit-b", "+1000")
        again = Sandbox.connect(sbx.sandbox_id, api_key=key)
        assert again.files.read("/home/user/keep.txt") == "kept across the pause"
    finally:
        Sandbox.kill(sbx.sandbox_id, api_key=key)


def test_kill_9_of_the_server_loses_at_most_one_interval(tserver):
    key = new_team(tserver, "crash-b")
    sbx = Sandbox.create(TEMPLATE, timeout=300, api_key=key)
    try:
        started = time.time()
        time.sleep(4)
        os.kill(tserver.proc.pid, signal.SIGKILL)
        tserver.proc.wait(timeout=30)
        killed = time.time()
        out = Cli(tserver)("usage", "--sandbox", sbx.sandbox_id, "--json")
        rec = json.loads(out)["sandboxes"]
        assert len(rec) == 1, out
        ran = killed - started
        # Created before `started`, so it ran at least `ran` seconds; at most one interval
        # (plus the time the create's answer took to arrive) is missing.
        assert rec[0]["running_seconds"] >= ran - INTERVAL_S - 0.5, (rec, ran)
        assert rec[0]["running_seconds"] <= ran + 5, (rec, ran)

        tserver._spawn()
        tserver.wait_ready(timeout=300)
        # Re-adopted, metered on from its last record: the downtime is counted as it ran.
        time.sleep(2 * INTERVAL_S + 0.5)
        total = usage(tserver, key, sandbox_id=sbx.sandbox_id)["sandboxes"][0]
        assert total["running_seconds"] >= time.time() - started - 2 * INTERVAL_S - 0.5, total
        assert Sandbox.connect(sbx.sandbox_id, api_key=key).commands.run("echo up").stdout == "up\n"
    finally:
        tserver.ensure_running()
        Sandbox.kill(sbx.sandbox_id, api_key=key)
