"""The interpreter API from inside the sandbox (`localhost:49999`, as E2B users' code calls
it), contexts in directories only root may enter (E2B runs kernels as root), and that the API
survives attempts to kill the process serving it."""

from __future__ import annotations

import json


def ok(ex):
    assert ex.error is None, f"{ex.error.name}: {ex.error.value}\n{ex.error.traceback}"
    return ex


def ndjson(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def curl_execute(sbx, body: dict, host: str = "localhost", user: str = "user") -> list:
    cmd = (
        f"curl -sS --fail-with-body -XPOST http://{host}:49999/execute "
        f"-H 'content-type: application/json' -d '{json.dumps(body)}'"
    )
    return ndjson(sbx.commands.run(cmd, user=user, timeout=60).stdout)


def test_execute_from_inside_the_sandbox_shares_the_kernel(sandbox):
    ok(sandbox.run_code("shared_value = 20"))
    lines = curl_execute(sandbox, {"code": "shared_value + 22"})
    assert {"type": "result", "text": "42", "is_main_result": True, "extra": {}} in lines, lines
    assert lines[-1] == {"type": "end_of_execution"}
    # ... and the other way round, with another language and the IPv4 address.
    curl_execute(sandbox, {"code": "var fromInside = 5", "language": "js"}, host="127.0.0.1")
    assert ok(sandbox.run_code("fromInside * 2", language="js")).text == "10"
    contexts = json.loads(sandbox.commands.run("curl -sS localhost:49999/contexts").stdout)
    assert {c["language"] for c in contexts} >= {"python", "javascript"}
    assert json.loads(sandbox.commands.run("curl -sS localhost:49999/health").stdout) == "OK"


def test_killing_every_process_does_not_take_the_api_down(sandbox):
    """The API is served by the agent, which the sandbox user cannot signal (it runs as the
    sandbox's root; its init, pid 1, ignores SIGKILL from inside); the kernels it supervises
    come back after being killed (E2B restarts dead kernels). (In-sandbox root can still kill
    the agent's server process, which ends the sandbox: see docs/threat-model.md.)"""
    ok(sandbox.run_code("doomed = 1"))
    ok(sandbox.run_code("var doomedJs = 1", language="js"))
    # As the sandbox user: SIGKILL to every process it may signal (`kill -1` spares the caller).
    sandbox.commands.run("kill -9 1 2>/dev/null; kill -9 -1; sleep 1")
    sandbox.commands.run("kill -9 1; sleep 0.5", user="root")
    # A kernel that died while idle is started again by the next execution.
    for language in ("python", "js"):
        r = sandbox.run_code("1 + 1", language=language)
        if r.error is not None:  # an execution that found the kernel dead
            assert r.error.name == "ContextRestarting", r.error
            r = sandbox.run_code("1 + 1", language=language)
        assert ok(r).text == "2"
    assert sandbox.run_code("doomed").error.name == "NameError"
    assert curl_execute(sandbox, {"code": "6 * 7"})[1]["text"] == "42"


def test_context_in_root_home(sandbox):
    ctx = sandbox.create_code_context(cwd="/root")
    assert ctx.cwd == "/root"
    r = ok(sandbox.run_code("import os; open('made-here.txt', 'w').write('x'); (os.getcwd(), os.getuid())", context=ctx))
    assert r.text == "('/root', 0)"
    assert sandbox.files.exists("/root/made-here.txt", user="root")
    c = sandbox.create_code_context(cwd="/root", language="bash")
    assert "".join(ok(sandbox.run_code("pwd; id -u", context=c)).logs.stdout) == "/root\n0\n"
    c = sandbox.create_code_context(cwd="/root", language="js")
    assert ok(sandbox.run_code("process.cwd()", context=c)).text == "/root"
    # Contexts where the sandbox user may go keep running as the sandbox user.
    c = sandbox.create_code_context(cwd="/tmp")
    assert ok(sandbox.run_code("import os; os.getuid()", context=c)).text == "1000"
