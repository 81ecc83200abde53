"""pytest wiring for the MCP suite (official PyPI `mcp` client against `bulkhead serve`'s `/mcp` and
`bulkhead mcp --stdio`).

The server fixture comes from tests/sdk/conftest.py (one real `bulkhead serve`, with the egress
lab's resolver overrides when the host can run it). Readiness waits for `code-interpreter-v1`,
the template of an MCP session's default sandbox. Every sandbox left at the end (a session that
did not close) is killed through the API before the server stops.
"""

from __future__ import annotations

import os

import pytest

import bulkhead_testlib

if not os.environ.get("BULKHEAD_TEST_TEMPLATE"):
    bulkhead_testlib.TEMPLATE = "code-interpreter-v1"


@pytest.fixture(scope="session", autouse=True)
def _kill_leftovers(server):
    yield
    server.kill_all_sandboxes()
