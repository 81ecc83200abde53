"""pytest wiring for the code-interpreter conformance suite (official PyPI `e2b-code-interpreter`).

The server fixture, log capture and env wiring come from tests/sdk/conftest.py (one real
`bulkhead serve`, the SDK pointed at it through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY).
This file only switches the readiness probe to the code-interpreter template and replaces the
`sandbox` fixtures with the code-interpreter SDK's `Sandbox`, created with the SDK's *default*
template (`code-interpreter-v1`), exactly as a user's `Sandbox.create()` would.
"""

from __future__ import annotations

import os

import pytest

import bulkhead_testlib

# The server is "ready" once it can create a sandbox of this template (the first start may
# build it). tests/sdk/conftest.py imported the testlib before this file, so set the module
# global rather than the environment; an explicit BULKHEAD_TEST_TEMPLATE still wins.
INTERPRETER_TEMPLATE = "code-interpreter-v1"
if not os.environ.get("BULKHEAD_TEST_TEMPLATE"):
    bulkhead_testlib.TEMPLATE = INTERPRETER_TEMPLATE

SUITE_METADATA = {"bulkhead-test": "interpreter"}


@pytest.fixture(scope="session")
def ci_factory(server):
    """Create code-interpreter sandboxes (SDK default template); all are killed at session end."""
    from e2b_code_interpreter import Sandbox

    made = []

    def make(timeout: int = 600, **kw):
        sbx = Sandbox.create(timeout=timeout, metadata=dict(SUITE_METADATA), **kw)
        made.append(sbx)
        return sbx

    yield make
    bulkhead_testlib.kill_quietly(made)


@pytest.fixture(scope="module")
def shared(ci_factory):
    """One sandbox per test module: most tests only need a working interpreter, and creating one
    per test would mostly measure kernel start-up. Killed when the module is done."""
    sbx = ci_factory()
    yield sbx
    bulkhead_testlib.kill_quietly([sbx])


@pytest.fixture
def sandbox_factory(ci_factory):
    """Fresh sandboxes for tests that change global state; killed when the test is done."""
    mine = []

    def make(**kw):
        sbx = ci_factory(**kw)
        mine.append(sbx)
        return sbx

    yield make
    bulkhead_testlib.kill_quietly(mine)


@pytest.fixture
def sandbox(sandbox_factory):
    """A fresh sandbox (crash the kernel, set sandbox envs, ...)."""
    return sandbox_factory()
