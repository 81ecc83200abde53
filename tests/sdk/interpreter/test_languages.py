"""Every language of the template through `run_code(..., language=...)` (each language's default
context, created lazily by the server) and through explicit contexts; state kept across calls."""

from __future__ import annotations

import pytest


def ok(ex):
    assert ex.error is None, f"{ex.error.name}: {ex.error.value}\n{ex.error.traceback}"
    return ex


# ---- JavaScript ------------------------------------------------------------------------------


def test_javascript_state_and_result(shared):
    ok(shared.run_code("var counter = 40; globalThis.tag = 'js'", language="javascript"))
    ok(shared.run_code("counter += 1", language="javascript"))
    r = ok(shared.run_code("counter + 1", language="javascript"))
    assert r.text == "42"
    assert r.results[0].is_main_result
    assert ok(shared.run_code("tag", language="javascript")).text == "js"
    # A python variable is not visible to the JS kernel and vice versa.
    r = shared.run_code("typeof x", language="javascript")
    assert r.text == "undefined"


def test_javascript_alias_js(shared):
    ok(shared.run_code("var viaAlias = 6", language="js"))
    assert ok(shared.run_code("viaAlias * 7", language="javascript")).text == "42"


def test_javascript_console_streams(shared):
    out, err = [], []
    r = ok(
        shared.run_code(
            "console.log('hello', 1 + 1); console.error('warn!'); 'done'",
            language="javascript",
            on_stdout=lambda m: out.append(m.line),
            on_stderr=lambda m: err.append(m.line),
        )
    )
    assert "".join(out) == "hello 2\n"
    assert "".join(err) == "warn!\n"
    assert r.text == "done"


def test_javascript_top_level_await(shared):
    r = ok(
        shared.run_code(
            "const waited = await new Promise((resolve) => setTimeout(() => resolve(7), 300));\nwaited * 6",
            language="javascript",
        )
    )
    assert r.text == "42"
    # and the awaited binding is state for the next call
    assert ok(shared.run_code("waited + 1", language="javascript")).text == "8"


def test_javascript_error(shared):
    r = shared.run_code("throw new TypeError('js broke')", language="javascript")
    assert r.error is not None
    assert r.error.name == "TypeError"
    assert r.error.value == "js broke"
    r = shared.run_code("notDefinedAnywhere + 1", language="javascript")
    assert r.error is not None and r.error.name == "ReferenceError"
    # Kernel still alive with its state.
    assert ok(shared.run_code("counter", language="javascript")).text == "41"


def test_javascript_node_builtins(shared):
    r = ok(shared.run_code("import os from 'node:os';\nos.userInfo().username", language="javascript"))
    assert r.text == "user"
    r = ok(shared.run_code("process.cwd()", language="javascript"))
    assert r.text == "/home/user"


def test_javascript_commonjs_require(shared):
    # E2B's JS kernel is Node-based, so user code written for it uses require().
    r = ok(shared.run_code("const fs = require('fs'); fs.existsSync('/home/user')", language="javascript"))
    assert r.text == "true"


def test_javascript_context_with_cwd(shared):
    ctx = shared.create_code_context(language="javascript", cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("javascript", "/tmp")
    assert ok(shared.run_code("process.cwd()", context=ctx)).text == "/tmp"
    ok(shared.run_code("var own = 1", context=ctx))
    # isolated from the default JS context
    assert shared.run_code("typeof own", language="javascript").text == "undefined"
    shared.remove_code_context(ctx)


# ---- TypeScript ------------------------------------------------------------------------------


def test_typescript_state_and_types(shared):
    ok(
        shared.run_code(
            "interface Pt { x: number; y: number }\n"
            "const origin: Pt = { x: 40, y: 2 };\n"
            "function sum(p: Pt): number { return p.x + p.y }",
            language="typescript",
        )
    )
    r = ok(shared.run_code("sum(origin)", language="typescript"))
    assert r.text == "42"
    r = ok(shared.run_code("const s: string = `v=${sum(origin)}`; s", language="ts"))
    assert r.text == "v=42"


def test_typescript_context(shared):
    ctx = shared.create_code_context(language="typescript")
    assert ctx.language == "typescript"
    r = ok(shared.run_code("const n: number = 5; n * 2", context=ctx))
    assert r.text == "10"
    shared.remove_code_context(ctx)


# ---- Bash ------------------------------------------------------------------------------------


def test_bash_state(shared):
    ok(shared.run_code("BH_X=41; cd /tmp", language="bash"))
    r = ok(shared.run_code("echo $((BH_X + 1)); pwd; whoami", language="bash"))
    assert "".join(r.logs.stdout) == "42\n/tmp\nuser\n"


def test_bash_stderr_and_context_cwd(shared):
    ctx = shared.create_code_context(language="bash", cwd="/var")
    assert ctx.language == "bash"
    r = shared.run_code("pwd; echo oops >&2", context=ctx)
    # bash_kernel (E2B's too) runs bash on a terminal, so stderr arrives merged into stdout;
    # either way both lines arrive, in order.
    out, err = "".join(r.logs.stdout), "".join(r.logs.stderr)
    assert (out, err) in (("/var\noops\n", ""), ("/var\n", "oops\n")), (out, err)
    shared.remove_code_context(ctx)


# ---- SQL -------------------------------------------------------------------------------------


def test_sql_state_and_data(shared):
    ok(
        shared.run_code(
            "CREATE TABLE people AS SELECT * FROM (VALUES (1, 'ada', 36.5::DOUBLE), (2, 'alan', 41.0::DOUBLE)) t(id, name, age)",
            language="sql",
        )
    )
    ok(shared.run_code("INSERT INTO people VALUES (3, 'grace', 85.25)", language="sql"))
    r = ok(shared.run_code("SELECT id, name, age FROM people ORDER BY id", language="sql"))
    tables = [x for x in r.results if x.data is not None]
    assert len(tables) == 1, [x.formats() for x in r.results]
    t = tables[0]
    assert t.data == {"id": [1, 2, 3], "name": ["ada", "alan", "grace"], "age": [36.5, 41.0, 85.25]}
    assert "grace" in t.text and "<table" in t.html


def test_sql_multiple_statements_last_result_and_error(shared):
    r = ok(shared.run_code("CREATE TABLE nums(n INTEGER); INSERT INTO nums VALUES (1), (2), (39); SELECT sum(n) AS total FROM nums", language="sql"))
    assert [x.data for x in r.results if x.data is not None] == [{"total": [42]}]
    r = shared.run_code("SELECT * FROM no_such_table", language="sql")
    assert r.error is not None
    assert "no_such_table" in r.error.value
    # still usable, state intact
    r = ok(shared.run_code("SELECT count(*) AS c FROM nums", language="sql"))
    assert [x.data for x in r.results if x.data is not None] == [{"c": [3]}]


def test_sql_explicit_context(shared):
    ctx = shared.create_code_context(language="sql")
    assert ctx.language == "sql"
    assert ctx.id in {c.id for c in shared.list_code_contexts()}
    r = ok(shared.run_code("SELECT 'x' AS a, 2 AS b", context=ctx))
    assert [x.data for x in r.results if x.data is not None] == [{"a": ["x"], "b": [2]}]
    shared.remove_code_context(ctx)


@pytest.mark.parametrize("lang,code,expect", [("python", "1+1", "2"), ("javascript", "1+1", "2"), ("typescript", "1+1", "2")])
def test_each_language_one_plus_one(shared, lang, code, expect):
    assert ok(shared.run_code(code, language=lang)).text == expect
