"""pytest wiring for the web console suite: one real `bulkhead serve` (tests/sdk/conftest.py,
with the egress lab's resolver overrides), the official Python SDK making sandboxes, and a real
headless Chromium (Debian's `chromium`, driven by Playwright from PyPI through
`executable_path`; Playwright's own browser download is never used).

Every sandbox left at the end is killed through the API before the server stops.
"""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("BULKHEAD_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session", autouse=True)
def _kill_leftovers(server):
    yield
    server.kill_all_sandboxes()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (scripts/test.sh does)")
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's own sandbox refuses to start.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(accept_downloads=True, base_url=server.url)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.console_errors = errors
    yield pg
    ctx.close()
