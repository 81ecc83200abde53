"""Code contexts (create/list/restart/remove, cwd), the API's 404/400 answers, execution timeouts
and a crashing kernel, through the official SDK (and raw HTTP where the SDK hides the wire)."""

from __future__ import annotations

import time

import pytest
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import Context

from _interp import ndjson, raw


def by_id(sbx):
    return {c.id: c for c in sbx.list_code_contexts()}


def test_default_contexts_listed(shared):
    ctxs = shared.list_code_contexts()
    langs = [c.language for c in ctxs]
    assert "python" in langs and "javascript" in langs, [(c.id, c.language, c.cwd) for c in ctxs]
    for c in ctxs:
        assert c.id and c.cwd == "/home/user", (c.id, c.language, c.cwd)
    assert len({c.id for c in ctxs}) == len(ctxs)


def test_create_python_context_with_cwd_and_isolation(shared):
    ctx = shared.create_code_context(cwd="/tmp")
    assert isinstance(ctx, Context)
    assert (ctx.language, ctx.cwd) == ("python", "/tmp")
    assert shared.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    shared.run_code("only_here = 'ctx'", context=ctx)
    assert shared.run_code("only_here", context=ctx).text == "ctx"
    # The default python context is a different kernel.
    assert shared.run_code("'only_here' in globals()").text == "False"
    listed = by_id(shared)
    assert ctx.id in listed
    assert (listed[ctx.id].language, listed[ctx.id].cwd) == ("python", "/tmp")
    shared.remove_code_context(ctx)


def test_create_default_context(shared):
    ctx = shared.create_code_context()
    assert (ctx.language, ctx.cwd) == ("python", "/home/user")
    assert shared.run_code("import os; os.getcwd()", context=ctx).text == "/home/user"
    assert shared.run_code("import os; os.getuid()", context=ctx).text == "1000"
    shared.remove_code_context(ctx.id)
    assert ctx.id not in by_id(shared)


def test_restart_context_resets_state(shared):
    ctx = shared.create_code_context(cwd="/tmp")
    shared.run_code("lost = 5\nimport os\nos.chdir('/')", context=ctx)
    assert shared.run_code("lost", context=ctx).text == "5"
    shared.restart_code_context(ctx)
    r = shared.run_code("lost", context=ctx)
    assert r.error is not None and r.error.name == "NameError"
    # Same id, still listed, and the context's cwd is applied again after the restart.
    assert ctx.id in by_id(shared)
    assert shared.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    shared.restart_code_context(ctx.id)  # by id string too
    assert shared.run_code("1 + 1", context=ctx).text == "2"
    shared.remove_code_context(ctx)


def test_remove_context(shared):
    ctx = shared.create_code_context()
    shared.remove_code_context(ctx)
    assert ctx.id not in by_id(shared)
    with pytest.raises(NotFoundException):
        shared.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        shared.remove_code_context(ctx)
    with pytest.raises(NotFoundException):
        shared.restart_code_context(ctx)


def test_unknown_context_404(shared):
    ghost = Context("no-such-context-id", "python", "/home/user")
    with pytest.raises(NotFoundException) as ei:
        shared.run_code("1", context=ghost)
    assert "no-such-context-id" in str(ei.value)
    r = raw(shared, "POST", "/execute", {"code": "1", "context_id": "no-such-context-id", "language": None, "env_vars": None})
    assert r.status == 404
    assert r.body.decode().strip() == "Context no-such-context-id not found", r.body[:300]
    with pytest.raises(NotFoundException):
        shared.restart_code_context("no-such-context-id")
    with pytest.raises(NotFoundException):
        shared.remove_code_context("no-such-context-id")


def test_context_and_language_both_400(shared):
    ctx = shared.list_code_contexts()[0]
    r = raw(shared, "POST", "/execute", {"code": "1", "context_id": ctx.id, "language": "python", "env_vars": None})
    assert r.status == 400, (r.status, r.body[:300])
    assert r.body, "the 400 must say why"
    # The server still works after refusing.
    assert shared.run_code("6 * 7").text == "42"


def test_raw_contexts_wire_shape(shared):
    r = raw(shared, "POST", "/contexts", {"language": "python", "cwd": "/tmp"})
    assert r.status == 200, r.body[:300]
    body = r.json()
    assert set(body) >= {"id", "language", "cwd"} and (body["language"], body["cwd"]) == ("python", "/tmp")
    r = raw(shared, "GET", "/contexts")
    assert r.status == 200 and body["id"] in [c["id"] for c in r.json()]
    r = raw(shared, "POST", f"/contexts/{body['id']}/restart")
    assert r.status == 200
    r = raw(shared, "DELETE", f"/contexts/{body['id']}")
    assert r.status == 200
    r = raw(shared, "DELETE", f"/contexts/{body['id']}")
    assert r.status == 404


def test_every_contexts_route_needs_the_sandboxs_token(shared):
    """Issue 22 row 10: from outside the sandbox, listing, creating, restarting and deleting
    kernels need the sandbox's token as `/execute` does (401 in E2B's shape without it); only
    `/health` is open. The context survives every refused call."""
    ctx = shared.create_code_context()
    shared.run_code("kept = 'still here'", context=ctx)
    for method, path, body in [
        ("GET", "/contexts", None),
        ("POST", "/contexts", {"language": "python", "cwd": "/tmp"}),
        ("POST", f"/contexts/{ctx.id}/restart", None),
        ("DELETE", f"/contexts/{ctx.id}", None),
        ("POST", "/execute", {"code": "1", "context_id": ctx.id}),
    ]:
        r = raw(shared, method, path, body, token=False)
        assert r.status == 401, (method, path, r.status, r.body[:300])
        assert ctx.id.encode() not in r.body
    assert raw(shared, "GET", "/health", token=False).status == 200
    assert shared.run_code("kept", context=ctx).text == "still here"


def test_timeout_raises_and_context_keeps_state(shared):
    ctx = shared.create_code_context()
    shared.run_code("keep = 41", context=ctx)
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        shared.run_code("import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('never')", context=ctx, timeout=2)
    assert time.monotonic() - t0 < 15, "the SDK timeout did not fire"
    # The abandoned cell is interrupted (not left sleeping for 60 s): the next call runs promptly,
    # sees the state and no output of the old cell leaks into it.
    t1 = time.monotonic()
    r = shared.run_code("print('next')\nkeep + 1", context=ctx, timeout=30)
    assert time.monotonic() - t1 < 15, f"next call took {time.monotonic() - t1:.1f}s: the old cell kept running"
    assert r.error is None, r.error
    assert r.text == "42"
    assert "".join(r.logs.stdout) == "next\n"
    shared.remove_code_context(ctx)


def test_timeout_in_default_context(shared):
    shared.run_code("kept_default = 'yes'")
    with pytest.raises(TimeoutException):
        shared.run_code("import time; time.sleep(45)", timeout=2)
    r = shared.run_code("kept_default", timeout=30)
    assert r.text == "yes"


def test_stream_after_timeout_is_clean(shared):
    """After the timeouts above, a fresh execution's stream holds only its own lines and ends
    with end_of_execution."""
    r = raw(shared, "POST", "/execute", {"code": "21 * 2", "context_id": None, "language": None, "env_vars": None})
    lines = ndjson(r.body)
    assert lines[-1]["type"] == "end_of_execution"
    assert [x["text"] for x in lines if x["type"] == "result"] == ["42"]
    assert [x for x in lines if x["type"] in ("stdout", "stderr", "error")] == []


def test_crashing_kernel_then_restart(sandbox):
    sandbox.run_code("before_crash = 1")
    t0 = time.monotonic()
    r = sandbox.run_code("import os\nos._exit(1)", timeout=90)
    assert time.monotonic() - t0 < 60
    assert r.error is not None, "a kernel that died mid-cell must be reported as an error"
    assert r.error.name, r.error
    py = [c for c in sandbox.list_code_contexts() if c.language == "python"]
    assert len(py) == 1, py
    sandbox.restart_code_context(py[0])
    r = sandbox.run_code("'before_crash' in globals(), 2 + 3", timeout=60)
    assert r.error is None, r.error
    assert r.text == "(False, 5)"

    # Same for a created context.
    ctx = sandbox.create_code_context()
    r = sandbox.run_code("import os; os._exit(3)", context=ctx, timeout=90)
    assert r.error is not None
    sandbox.restart_code_context(ctx)
    assert sandbox.run_code("10 * 10", context=ctx, timeout=60).text == "100"
    # The default context was not disturbed by the other kernel's crash.
    assert sandbox.run_code("2 + 3").text == "5"
