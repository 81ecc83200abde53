"""pytest wiring for the SDK conformance suites.

A session fixture starts one real `bulkhead serve` (binary from `BULKHEAD_BIN`, default
target/debug/bulkhead; a free port; a temp data dir; the image cache from
`BULKHEAD_IMAGE_CACHE`, default /var/cache/bulkhead/images; a generated key seeded through
`BULKHEAD_API_KEY`), or uses an external one when `BULKHEAD_TEST_URL` (+ `BULKHEAD_TEST_API_KEY`,
optionally `BULKHEAD_TEST_DATA_DIR`, `BULKHEAD_TEST_SERVER_PID`) is set. The official SDKs are
pointed at it purely through their documented environment variables.

On a failing test the server log lines written during that test are attached to the report; when
the session fails, the tail of the server log is printed at the end.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bulkhead_testlib import (  # noqa: E402
    TEMPLATE,
    BulkheadServer,
    kill_quietly,
)
import egresslab  # noqa: E402
import registrylab  # noqa: E402

RUN_ID = os.urandom(4).hex()
_SERVER: BulkheadServer | None = None
_SESSION_LOG_TAIL: str = ""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (the 200-cycle leak test); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "destructive: fork/memory bombs and other stress inside sandboxes")


def pytest_collection_modifyitems(session, config, items):
    # The leak test checks the host after everything else and stops the server: run it last.
    items.sort(key=lambda it: 1 if it.get_closest_marker("slow") else 0)


@pytest.fixture(scope="session")
def server():
    global _SERVER, _SESSION_LOG_TAIL
    # The egress tests' upstream CA and TEST-ONLY resolver overrides must be given at start.
    pki = None
    extra = []
    if not os.environ.get("BULKHEAD_TEST_URL") and egresslab.missing_tools() is None:
        pki = egresslab.TestPki()
        extra = egresslab.serve_args(pki)
    # Image pulls go to a registry on loopback (docker.io included, so `from_debian_image()`
    # never leaves the machine); `unreachable.invalid` names a port nobody listens on.
    registry = None
    if not os.environ.get("BULKHEAD_TEST_URL"):
        if registrylab.missing() is None:
            registry = registrylab.Registry()
        hub = registry.host if registry else f"127.0.0.1:{registrylab.free_port()}"
        extra += [
            "--registry-mirror", f"docker.io=http://{hub}",
            "--registry-mirror", f"unreachable.invalid=http://127.0.0.1:{registrylab.free_port()}",
            # Loopback registries (the mirror, tests' own on other ports) are the operator's
            # explicit choice: allowed by name and reached over plain HTTP.
            "--registry-allow", "docker.io,unreachable.invalid,127.0.0.1,localhost",
            "--registry-insecure", "127.0.0.1,localhost",
            "--registry-connect-timeout", "3",
        ]
    srv = BulkheadServer.from_env(extra_args=extra)
    srv.egress_pki = pki
    srv.registry = registry
    _SERVER = srv
    os.environ["E2B_API_URL"] = srv.url
    os.environ["E2B_SANDBOX_URL"] = srv.url
    os.environ["E2B_API_KEY"] = srv.api_key
    for k in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        os.environ.pop(k, None)
    no_proxy = os.environ.get("NO_PROXY", "")
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(x for x in (no_proxy, "127.0.0.1", "localhost") if x)
    yield srv
    failed = srv.owned and (srv.proc.poll() is not None and srv.proc.returncode not in (0, None))
    srv.stop()
    if pki is not None:
        pki.cleanup()
    if registry is not None:
        registry.stop()
    _SESSION_LOG_TAIL = srv.log_tail(150)
    session_failed = failed or _SESSION_FAILED[0]
    if srv.owned:
        if session_failed or os.environ.get("BULKHEAD_KEEP_DATA"):
            print(f"\nbulkhead test data kept at {srv.tmp_root}", file=sys.stderr)
        else:
            srv.cleanup_files()


_SESSION_FAILED = [False]


@pytest.fixture(autouse=True)
def _server_log_marker(request, server):
    server.ensure_running()
    request.node._bulkhead_log_offset = server.log_size()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        _SESSION_FAILED[0] = True
        off = getattr(item, "_bulkhead_log_offset", None)
        if _SERVER is not None and off is not None:
            text = _SERVER.log_since(off, max_lines=150)
            if text:
                rep.sections.append(("bulkhead server log (during this test)", text))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if exitstatus not in (0, 5) and _SESSION_LOG_TAIL:
        terminalreporter.section("bulkhead server log (tail)")
        terminalreporter.write_line(_SESSION_LOG_TAIL)


# ---- SDK fixtures ---------------------------------------------------------------------------

SUITE_METADATA = {"bulkhead-test": RUN_ID}


@pytest.fixture(scope="session")
def run_id():
    return RUN_ID


@pytest.fixture(scope="module")
def lab(server):
    """Egress upstreams (HTTP and HTTPS echo servers) in a network namespace of the test's own
    (`egresslab`); the suite's server resolves the test names there."""
    if getattr(server, "egress_pki", None) is None:
        why = egresslab.missing_tools() or "the server was not started by this suite (BULKHEAD_TEST_URL)"
        pytest.skip(f"SKIPPED: egress lab unavailable: {why}")
    lab = egresslab.UpstreamLab(server.egress_pki).start()
    yield lab
    lab.close()
    assert not lab.exists(), "the test namespace or veth pair was left behind"


@pytest.fixture
def sandbox_factory(server):
    """Create sandboxes with the current SDK's `Sandbox.create`; all are killed afterwards."""
    from e2b import Sandbox

    made = []

    def make(timeout: int = 180, metadata=None, **kw):
        md = dict(SUITE_METADATA)
        md.update(metadata or {})
        sbx = Sandbox.create(template=TEMPLATE, timeout=timeout, metadata=md, **kw)
        made.append(sbx)
        return sbx

    yield make
    kill_quietly(made)


@pytest.fixture
def sandbox(sandbox_factory):
    return sandbox_factory()
