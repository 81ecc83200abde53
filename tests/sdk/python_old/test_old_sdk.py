"""A small subset run with an OLDER 2.x release of the Python SDK (pinned in
requirements-old.txt), the generation that creates with `POST /sandboxes` and connects with
`POST /sandboxes/{id}/connect` (`secure: true`, client-side `e2b_` key validation).

Run in its own venv: `<old venv>/bin/python -m pytest tests/sdk/python_old`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import logging
import time
import urllib.parse

import pytest
from e2b import CommandExitException, Sandbox, SandboxException

from bulkhead_testlib import TEMPLATE

OLD_VERSION = "2.45.1"


class _Rec(logging.Handler):
    def __init__(self):
        super().__init__()
        self.requests = []

    def emit(self, record):
        parts = record.getMessage().split()
        if len(parts) >= 3 and parts[0] == "Request":
            self.requests.append((parts[1].upper(), urllib.parse.urlsplit(parts[2]).path))


def _logger(name):
    lg = logging.getLogger(f"bulkhead-old-sdk.{name}")
    lg.setLevel(logging.INFO)
    lg.propagate = False
    rec = _Rec()
    lg.handlers = [rec]
    return lg, rec


def test_this_is_the_old_generation():
    assert importlib.metadata.version("e2b") == OLD_VERSION
    # This release has no v2 create/connect client at all …
    assert importlib.util.find_spec("e2b.api.client.api.sandboxes.post_v2_sandboxes") is None
    # … and creates through the v1 endpoint.
    from e2b.api.client.api.sandboxes import post_sandboxes, post_sandboxes_sandbox_id_connect
    from e2b.sandbox_sync.sandbox_api import SandboxApi

    assert post_sandboxes._get_kwargs(body=_Body())["url"] == "/sandboxes"
    assert post_sandboxes_sandbox_id_connect._get_kwargs("x", body=_Body())["url"] == "/sandboxes/x/connect"
    src = inspect.getsource(SandboxApi)
    assert "post_sandboxes.sync_detailed" in src


class _Body:
    def to_dict(self):
        return {}


def test_create_connect_kill_with_old_sdk(server, run_id):
    lg, rec = _logger("create")
    sbx = Sandbox.create(template=TEMPLATE, timeout=120, metadata={"bulkhead-test": run_id, "sdk": "old"}, envs={"OLD": "yes"}, logger=lg)
    try:
        assert ("POST", "/sandboxes") in rec.requests, rec.requests
        assert not any(p.startswith("/v2/sandboxes") and m == "POST" for m, p in rec.requests)
        assert sbx.is_running()
        r = sbx.commands.run('echo "old:$OLD"; whoami')
        assert r.stdout == "old:yes\nuser\n"
        with pytest.raises(CommandExitException) as ei:
            sbx.commands.run("exit 4")
        assert ei.value.exit_code == 4

        sbx.files.write("/home/user/old.txt", "from the old sdk")
        assert sbx.files.read("/home/user/old.txt") == "from the old sdk"
        assert [e.name for e in sbx.files.list("/home/user") if e.name == "old.txt"] == ["old.txt"]

        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata["sdk"] == "old"

        lg2, rec2 = _logger("connect")
        same = Sandbox.connect(sbx.sandbox_id, timeout=600, logger=lg2)
        assert ("POST", f"/sandboxes/{sbx.sandbox_id}/connect") in rec2.requests, rec2.requests
        assert same.files.read("/home/user/old.txt") == "from the old sdk"
        end = info.end_at
        assert same.get_info().end_at > end  # extended to 600 s

        h = same.commands.run("sleep 1; echo bg", background=True)
        assert h.wait().stdout == "bg\n"
    finally:
        assert sbx.kill() is True
    assert sbx.kill() is False
    assert not sbx.is_running()
    with pytest.raises(SandboxException):
        sbx.get_info()


def test_old_sdk_short_timeout(server, run_id):
    sbx = Sandbox.create(template=TEMPLATE, timeout=3, metadata={"bulkhead-test": run_id, "sdk": "old"})
    t0 = time.monotonic()
    try:
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        while time.monotonic() - t0 < 10 and sbx.is_running():
            time.sleep(0.5)
        assert not sbx.is_running()
    finally:
        sbx.kill()
