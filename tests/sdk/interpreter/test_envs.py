"""Environment variables: per-call `envs=` (visible during that call only, in every language) and
sandbox-level `Sandbox.create(envs=...)` (visible to every kernel; a per-call value overrides it
for one call and the global value comes back)."""

from __future__ import annotations

import pytest

PY_GET = "import os; os.environ.get('BH_CALL', '<unset>')"
SUB_GET = (
    "import subprocess\n"
    "subprocess.run(['sh', '-c', 'echo ${BH_CALL:-none}'], capture_output=True, text=True).stdout.strip()"
)


def test_per_call_env_python(shared):
    r = shared.run_code(PY_GET, envs={"BH_CALL": "v1"})
    assert r.text == "v1"
    # child processes of the kernel see it too during the call
    r = shared.run_code(SUB_GET, envs={"BH_CALL": "v2"})
    assert r.text == "v2"
    assert shared.run_code(PY_GET).text == "<unset>"
    assert shared.run_code(SUB_GET).text == "none"


def test_per_call_env_in_created_context(shared):
    ctx = shared.create_code_context()
    assert shared.run_code(PY_GET, context=ctx, envs={"BH_CALL": "ctx"}).text == "ctx"
    assert shared.run_code(PY_GET, context=ctx).text == "<unset>"
    shared.remove_code_context(ctx)


def test_per_call_env_javascript(shared):
    r = shared.run_code("process.env.BH_CALL", language="javascript", envs={"BH_CALL": "js1"})
    assert r.text == "js1"
    r = shared.run_code("String(process.env.BH_CALL)", language="javascript")
    assert r.text == "undefined"


def test_per_call_env_bash(shared):
    r = shared.run_code("echo ${BH_CALL:-unset}", language="bash", envs={"BH_CALL": "sh1"})
    assert "".join(r.logs.stdout) == "sh1\n"
    r = shared.run_code("echo ${BH_CALL:-unset}", language="bash")
    assert "".join(r.logs.stdout) == "unset\n"


def test_per_call_env_value_with_quotes(shared):
    tricky = "a 'b' \"c\" $d \\e\nline2"
    r = shared.run_code("import os; os.environ['BH_TRICKY']", envs={"BH_TRICKY": tricky})
    assert r.error is None, r.error
    r2 = shared.run_code("import os; os.environ['BH_TRICKY'] == " + repr(tricky), envs={"BH_TRICKY": tricky})
    assert r2.text == "True"


def test_sandbox_level_envs(sandbox_factory):
    sbx = sandbox_factory(envs={"BH_SBX": "global", "BH_SBX2": "two"})
    assert sbx.run_code("import os; (os.environ['BH_SBX'], os.environ['BH_SBX2'])").text == "('global', 'two')"
    assert sbx.run_code("process.env.BH_SBX", language="javascript").text == "global"
    r = sbx.run_code("echo $BH_SBX", language="bash")
    assert "".join(r.logs.stdout) == "global\n"
    # A per-call value wins for that call, then the sandbox value is back.
    assert sbx.run_code("import os; os.environ['BH_SBX']", envs={"BH_SBX": "local"}).text == "local"
    assert sbx.run_code("import os; os.environ['BH_SBX']").text == "global"
    # Contexts created later see them too.
    ctx = sbx.create_code_context()
    assert sbx.run_code("import os; os.environ.get('BH_SBX2')", context=ctx).text == "two"
    # and plain commands (envd) agree
    assert sbx.commands.run("echo $BH_SBX").stdout == "global\n"
