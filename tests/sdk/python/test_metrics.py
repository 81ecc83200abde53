"""`GET /metrics`: the Prometheus exposition of a real server, read before and after real
sandboxes are created, used and killed through the official SDK. Other tests share the
server, so every check is on a difference or on a level that this test controls.
"""

from __future__ import annotations

import re
import time

from e2b import CommandExitException

from bulkhead_testlib import http

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> dict:
    r = http("GET", f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.api_key}"})
    assert r.status == 200, (r.status, r.body[:500])
    assert r.header("content-type").startswith("text/plain"), r.headers
    out = {}
    for line in r.body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"not exposition format: {line!r}"
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(metrics: dict, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(server, pred, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(server)
        if pred(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def test_metrics_need_an_api_key(server):
    assert http("GET", f"{server.url}/metrics").status == 401
    bad = "e2b_" + "0" * 40
    assert http("GET", f"{server.url}/metrics", headers={"Authorization": f"Bearer {bad}"}).status == 401
    r = http("GET", f"{server.url}/metrics", headers=server.api_headers())
    assert r.status == 200 and b"bulkhead_pool_members" in r.body, r.body[:500]


def test_creates_levels_and_stops_are_counted(server, sandbox_factory):
    before = scrape(server)
    sbx = sandbox_factory()
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    during = scrape(server)
    assert value(during, "bulkhead_sandbox_creates_total", template="base", outcome="ok") == (
        value(before, "bulkhead_sandbox_creates_total", template="base", outcome="ok") + 1
    )
    assert value(during, "bulkhead_sandbox_create_seconds_count", template="base") == (
        value(before, "bulkhead_sandbox_create_seconds_count", template="base") + 1
    )
    claims = sum(
        value(during, "bulkhead_pool_claims_total", template="base", result=r) for r in ("hit", "miss")
    ) - sum(value(before, "bulkhead_pool_claims_total", template="base", result=r) for r in ("hit", "miss"))
    assert claims == 1, claims
    # The level is the store's: the running `base` sandboxes the list API shows.
    r = http("GET", f"{server.url}/v2/sandboxes?state=running&limit=100", headers=server.api_headers())
    running = sum(1 for s in r.json() if s["templateID"] == "base")
    assert value(during, "bulkhead_sandboxes", state="running", template="base") == running >= 1
    assert ("bulkhead_pool_members", (("template", "base"),)) in during

    sbx.kill()
    after = wait_for(
        server,
        lambda m: value(m, "bulkhead_sandbox_stops_total", reason="killed")
        > value(during, "bulkhead_sandbox_stops_total", reason="killed"),
    )
    assert value(after, "bulkhead_sandbox_stops_total", reason="killed") == (
        value(during, "bulkhead_sandbox_stops_total", reason="killed") + 1
    )
    assert value(after, "bulkhead_sandboxes", state="running", template="base") == running - 1


def test_errors_are_counted_by_status(server):
    before = scrape(server)
    for _ in range(3):
        r = http("GET", f"{server.url}/sandboxes/inoexist0000000000000", headers=server.api_headers())
        assert r.status == 404
    # A create from a template that does not exist: its outcome, under no caller-chosen label.
    r = http("POST", f"{server.url}/sandboxes", body={"templateID": "no-such-template-xyz"}, headers=server.api_headers())
    assert r.status == 404
    after = scrape(server)
    assert value(after, "bulkhead_http_responses_total", status="404") >= (
        value(before, "bulkhead_http_responses_total", status="404") + 4
    )
    assert value(after, "bulkhead_sandbox_creates_total", template="other", outcome="not_found") == (
        value(before, "bulkhead_sandbox_creates_total", template="other", outcome="not_found") + 1
    )
    assert not any("no-such-template-xyz" in str(k) for k in after), "a caller's string became a label"


def test_egress_denials_are_counted(server, sandbox_factory):
    before = scrape(server)
    sbx = sandbox_factory(network={"allow_out": ["api.allowed.test"]})
    try:
        sbx.commands.run("curl -sS -m 5 http://denied.test/", timeout=30)
    except CommandExitException:
        pass  # denied, as it should be

    def denied(m):
        return sum(v for (n, l), v in m.items() if n == "bulkhead_egress_decisions_total" and ("verdict", "denied") in l)

    after = wait_for(server, lambda m: denied(m) > denied(before))
    assert denied(after) > denied(before), "the denied connection was not counted"
