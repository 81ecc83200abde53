"""The web console at /console in a real headless Chromium, against a real server and sandboxes
made with the official Python SDK: log in with the API key, see a sandbox appear, open it, see
a process the SDK started, download a file the SDK wrote (same bytes), see the egress audit
trail's entry for a denied connection, see the sandbox disappear when killed; a wrong key and a
revoked key are refused with a clear page; markup in metadata and file names renders as text;
cross-site requests and requests without the console's header are refused."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from e2b import Sandbox
from playwright.sync_api import expect

from bulkhead_testlib import TEMPLATE, http

# Markup that would run if any of these strings reached the page as HTML.
XSS_META = '<img src=x onerror="window.__xss=\'metadata\'">'
XSS_FILE = "<img src=x onerror=window.__xss=1>.txt"


def login(page, key):
    page.goto("/console/")
    page.fill("#api-key", key)
    page.click("#login-form button[type=submit]")


def no_script_ran(page):
    assert page.evaluate("window.__xss") is None
    assert page.console_errors == [], page.console_errors


def cli(server, *args):
    r = subprocess.run(
        [server._argv[0], *args, "--data-dir", str(server.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"bulkhead {' '.join(args)}: {r.stdout}\n{r.stderr}"
    return r.stdout


def test_wrong_key_is_refused(page, server):
    login(page, "e2b_" + "0" * 40)
    expect(page.locator("#login-error")).to_contain_text("not accepted")
    expect(page.locator("#top")).to_be_hidden()
    # The JSON side: E2B's error shape, no session.
    r = http("GET", f"{server.url}/console/api/v2/sandboxes")
    assert r.status == 401 and r.json()["code"] == 401 and r.json()["message"], r.body
    r = http("POST", f"{server.url}/console/api/login", body={"apiKey": "nope"},
             headers={"X-Bulkhead-Console": "1"})
    assert r.status == 401 and "not accepted" in r.json()["message"], r.body


def test_session_cookie_csp_and_csrf(server):
    r = http("GET", f"{server.url}/console/")
    assert r.status == 200
    csp = r.header("content-security-policy")
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp, csp
    assert b"<script>" not in r.body and b"onclick" not in r.body
    # Login needs the console's header (a form another site posts has none).
    r = http("POST", f"{server.url}/console/api/login", body={"apiKey": server.api_key})
    assert r.status == 403, r.body
    r = http("POST", f"{server.url}/console/api/login", body={"apiKey": server.api_key},
             headers={"X-Bulkhead-Console": "1", "Origin": "http://evil.test"})
    assert r.status == 403, r.body
    r = http("POST", f"{server.url}/console/api/login", body={"apiKey": server.api_key},
             headers={"X-Bulkhead-Console": "1"})
    assert r.status == 200, r.body
    set_cookie = r.header("set-cookie")
    for attr in ("HttpOnly", "SameSite=Strict", "Path=/console"):
        assert attr in set_cookie, set_cookie
    assert server.api_key not in set_cookie
    cookie = set_cookie.split(";")[0]
    ok = http("GET", f"{server.url}/console/api/v2/sandboxes", headers={"Cookie": cookie})
    assert ok.status == 200 and isinstance(ok.json(), list), ok.body
    assert ok.header("cache-control") == "no-store"
    # A page on another site cannot use the session, nor change anything without the header.
    r = http("GET", f"{server.url}/console/api/v2/sandboxes", headers={"Cookie": cookie, "Sec-Fetch-Site": "cross-site"})
    assert r.status == 403, r.body
    r = http("DELETE", f"{server.url}/console/api/sandboxes/nope", headers={"Cookie": cookie})
    assert r.status == 403, r.body
    # Only the listed routes are replayed: no creates, no secrets.
    r = http("POST", f"{server.url}/console/api/v2/sandboxes", body={"templateID": TEMPLATE},
             headers={"Cookie": cookie, "X-Bulkhead-Console": "1"})
    assert r.status == 404, r.body
    r = http("GET", f"{server.url}/console/api/secrets", headers={"Cookie": cookie})
    assert r.status == 404, r.body
    r = http("POST", f"{server.url}/console/api/logout", headers={"Cookie": cookie, "X-Bulkhead-Console": "1"})
    assert r.status == 204
    r = http("GET", f"{server.url}/console/api/v2/sandboxes", headers={"Cookie": cookie})
    assert r.status == 401, r.body


def test_console_follows_a_sandbox(page, server, run_id, tmp_path):
    login(page, server.api_key)
    expect(page.locator("#top")).to_be_visible()
    expect(page.locator("#list")).to_be_visible()

    sbx = Sandbox.create(
        template=TEMPLATE,
        timeout=300,
        metadata={"bulkhead-test": run_id, "note": XSS_META},
        network={"allow_out": ["api.allowed.test"]},
    )
    try:
        sid = sbx.sandbox_id
        row = page.locator(f'#sandboxes tr[data-sandbox-id="{sid}"]')
        expect(row).to_be_visible(timeout=20_000)
        expect(row).to_contain_text("running")
        expect(row.locator(".metadata")).to_contain_text(XSS_META)
        assert row.locator("img").count() == 0

        # What the SDK does inside: a long process, a binary file, a file named like markup,
        # and a connection the network policy denies.
        proc = sbx.commands.run("sleep 600 # console-probe", background=True, envs={"PROBE_SECRET": "s3cr3t-env-value"})
        payload = os.urandom(200_000) + b"\x00end"
        sbx.files.write("/home/user/report.bin", payload)
        sbx.files.write(f"/home/user/{XSS_FILE}", "markup in a name")
        denied = sbx.commands.run("curl -sS -m 5 http://denied.test/ || true", timeout=60)
        assert denied.exit_code == 0

        row.locator("a").click()
        expect(page).to_have_url(re.compile(f"#/sandboxes/{sid}$"))
        expect(page.locator("#metadata")).to_contain_text(XSS_META)
        expect(page.locator("#proc-table")).to_contain_text("console-probe")
        expect(page.locator(f'#proc-table tr[data-pid="{proc.pid}"]')).to_be_visible()
        expect(page.locator("#charts svg")).to_have_count(2)

        # Download the SDK's file through the browser: the same bytes.
        files = page.locator("#file-table")
        expect(files.locator('tr[data-file="report.bin"]')).to_be_visible()
        with page.expect_download() as dl:
            files.locator('tr[data-file="report.bin"] a.download').click()
        saved = tmp_path / "report.bin"
        dl.value.save_as(saved)
        assert dl.value.suggested_filename == "report.bin"
        assert saved.read_bytes() == payload

        # The markup-named file is listed as text and downloads with its name.
        xss_row = files.locator("tr", has_text=XSS_FILE)
        expect(xss_row).to_be_visible()
        assert files.locator("img").count() == 0
        with page.expect_download() as dl:
            xss_row.locator("a.download").click()
        dl.value.save_as(tmp_path / "x")
        assert (tmp_path / "x").read_bytes() == b"markup in a name"

        # The denied connection is in the egress audit trail.
        denied_row = page.locator("#egress-table tr.egress-deny", has_text="denied.test")
        expect(denied_row.first).to_be_visible(timeout=20_000)
        no_script_ran(page)

        # The JSON routes behind it: processes without their environment; downloads by the
        # agent's rules (home-relative paths, the default user's permissions, symlinks
        # followed inside the sandbox), errors in E2B's shape.
        hdr = server.api_headers()
        own = f"{server.url}/bulkhead/v1/sandboxes/{sid}"
        r = http("GET", f"{own}/processes", headers=hdr)
        assert r.status == 200 and any(p["pid"] == proc.pid for p in r.json()), r.body
        assert b"s3cr3t-env-value" not in r.body and b"PROBE_SECRET" not in r.body
        r = http("GET", f"{own}/files/content?path=report.bin", headers=hdr)
        assert r.status == 200 and r.body == payload
        assert r.header("content-disposition").startswith('attachment; filename="report.bin"')
        sbx.commands.run("ln -s /etc/shadow /home/user/shadow-link")
        for bad in ("/etc/shadow", "../../etc/shadow", "shadow-link"):
            r = http("GET", f"{own}/files/content?path={bad}", headers=hdr)
            assert 400 <= r.status < 500 and r.json()["code"] == r.status and r.json()["message"], (bad, r.status, r.body)
        r = http("GET", f"{own}/files/content?path=/home/user/missing", headers=hdr)
        assert r.status == 404 and r.json()["code"] == 404, r.body

        sbx.kill()
        expect(page.locator("#gone")).to_be_visible(timeout=20_000)
        page.click('a[href="#/sandboxes"]')
        expect(page.locator("#list-status")).to_be_visible()
        page.wait_for_function(
            "id => !document.querySelector(`#sandboxes tr[data-sandbox-id=\"${id}\"]`) && "
            "document.getElementById('list-status').textContent.includes('updated')",
            arg=sid,
        )
        no_script_ran(page)
    finally:
        try:
            sbx.kill()
        except Exception:
            pass


def test_team_scope_keys_usage_and_revoke(page, server, run_id):
    team = f"console-{run_id}"
    cli(server, "teams", "create", team, "--credits", "500")
    key = cli(server, "keys", "create", "--team", team, "--name", f"{team}-main").strip()
    cli(server, "keys", "create", "--team", team, "--name", "<b>second</b>")
    # A sandbox of the default team, which the other team must not see.
    other = Sandbox.create(template=TEMPLATE, timeout=120, metadata={"bulkhead-test": run_id})
    try:
        login(page, key)
        expect(page.locator("#who")).to_contain_text("team ")
        expect(page.locator("#list")).to_contain_text("No running or paused sandboxes")
        page.goto(f"/console/#/sandboxes/{other.sandbox_id}")
        # Another team's sandbox does not exist for this one.
        expect(page.locator("#gone")).to_be_visible()

        page.click('a[href="#/usage"]')
        expect(page.locator("#credits")).to_have_text(re.compile(r"^500(\.0+)?$"))
        expect(page.locator("#usage-table")).to_be_visible()

        page.click('a[href="#/keys"]')
        keys = page.locator("#key-table")
        expect(keys).to_contain_text(f"{team}-main")
        expect(keys).to_contain_text("(this session)")
        expect(keys).to_contain_text("<b>second</b>")
        assert keys.locator("b").count() == 0
        assert "default" not in keys.inner_text()

        # Revoking the session's own key ends the session at once, with a clear page.
        page.on("dialog", lambda d: d.accept())
        keys.locator("tr", has_text=f"{team}-main").locator("button").click()
        expect(page.locator("#login-error")).to_contain_text("revoked")
        expect(page.locator("#top")).to_be_hidden()
        # The revoked key cannot log in again either.
        login(page, key)
        expect(page.locator("#login-error")).to_contain_text("not accepted")
        no_script_ran(page)
    finally:
        other.kill()
