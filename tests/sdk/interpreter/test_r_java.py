"""R (Debian's IRkernel) and Java (JJava on the JDK's JShell) through `run_code(...,
language=...)` and explicit contexts: state across calls, per-call env vars, cwd, errors, and
kernels that start only on first use."""

from __future__ import annotations

import pytest


def ok(ex):
    assert ex.error is None, f"{ex.error.name}: {ex.error.value}\n{ex.error.traceback}"
    return ex


def texts(ex) -> list:
    return [r.text for r in ex.results]


@pytest.fixture(scope="module")
def sbx(ci_factory):
    return ci_factory()


# ---- kernels start on first use ------------------------------------------------------------


def test_r_and_java_kernels_do_not_run_until_used(sandbox):
    """Neither kernel is started with the sandbox (they cost ~100 MiB and most sandboxes never
    use them), nor listed as a context until asked for."""
    procs = sandbox.commands.run("ps -eo args", user="root").stdout
    assert "IRkernel" not in procs and "jjava" not in procs, procs
    assert {c.language for c in sandbox.list_code_contexts()} <= {"python", "javascript"}
    ok(sandbox.run_code("1", language="r"))
    procs = sandbox.commands.run("ps -eo args", user="root").stdout
    assert "IRkernel" in procs and "jjava" not in procs, procs


# ---- R ---------------------------------------------------------------------------------------


def test_r_state_and_results(sbx):
    ok(sbx.run_code("x <- 41", language="r"))
    r = ok(sbx.run_code("x + 1", language="r"))
    # IRkernel publishes values as display_data (as on E2B, which runs the same kernel).
    assert texts(r) == ["[1] 42"]
    r = ok(sbx.run_code("cat('out\\n'); message('err'); invisible(7)", language="r"))
    assert r.logs.stdout == ["out\n"] and "".join(r.logs.stderr).strip() == "err" and r.results == []
    r = ok(sbx.run_code("data.frame(a = 1:2, b = c('u', 'v'))", language="r"))
    assert "text/html" in str(r.results[0].formats()) or r.results[0].html, r.results[0].formats()


def test_r_error(sbx):
    r = sbx.run_code("stop('boom')", language="r")
    assert r.error is not None and r.error.name == "ERROR"
    assert "boom" in r.error.value
    # The kernel lives on.
    assert texts(ok(sbx.run_code("x", language="r"))) == ["[1] 41"]


def test_r_env_vars_and_cwd(sbx):
    r = ok(sbx.run_code("Sys.getenv('BH_R')", language="r", envs={"BH_R": "it's \"quoted\""}))
    assert texts(r) == ['[1] "it\'s \\"quoted\\""']
    # Per-call variables are restored afterwards.
    assert texts(ok(sbx.run_code("Sys.getenv('BH_R')", language="r"))) == ['[1] ""']
    assert texts(ok(sbx.run_code("getwd()", language="r"))) == ['[1] "/home/user"']
    ctx = sbx.create_code_context(cwd="/tmp", language="r")
    assert ctx.language == "r" and ctx.cwd == "/tmp"
    assert texts(ok(sbx.run_code("getwd()", context=ctx))) == ['[1] "/tmp"']
    # A new context has its own state.
    assert ok(sbx.run_code("exists('x')", context=ctx)).results[0].text == "[1] FALSE"


def test_r_plot_is_a_png(sbx):
    r = ok(sbx.run_code("plot(1:10)", language="r"))
    assert len(r.results) == 1 and r.results[0].png


# ---- Java ------------------------------------------------------------------------------------


def test_java_state_and_results(sbx):
    ok(sbx.run_code("int x = 41;", language="java"))
    r = ok(sbx.run_code("x + 1", language="java"))
    assert r.text == "42" and r.results[0].is_main_result
    ok(sbx.run_code("String greet(String n) { return \"hi \" + n; }", language="java"))
    r = ok(sbx.run_code('System.out.println(greet("out")); System.err.println("err");', language="java"))
    assert r.logs.stdout == ["hi out\n"] and r.logs.stderr == ["err\n"]
    r = ok(sbx.run_code("import java.util.*;\nvar l = new ArrayList<>(List.of(3, 1, 2));\nCollections.sort(l);\nl", language="java"))
    assert r.text == "[1, 2, 3]"


def test_java_errors(sbx):
    r = sbx.run_code('throw new IllegalStateException("boom");', language="java")
    # JJava (like IJava, E2B's Java kernel) reports exceptions thrown by a cell as
    # RuntimeException with the real class in the value.
    assert r.error is not None and r.error.name == "RuntimeException"
    assert r.error.value == "java.lang.IllegalStateException, boom"
    r = sbx.run_code("int y = ;", language="java")
    assert r.error is not None and r.error.name == "CompilationException"
    assert ok(sbx.run_code("x", language="java")).text == "41"


def test_java_env_vars_and_cwd(sbx):
    r = ok(sbx.run_code('System.getenv("BH_J")', language="java", envs={"BH_J": "a\"b\\c"}))
    assert r.text == 'a"b\\c'
    # (Java cannot change its own process environment, so processes the kernel starts with
    # ProcessBuilder inherit only the kernel's start-up environment plus what
    # `pb.environment()` adds.)
    assert ok(sbx.run_code('System.getenv("BH_J") == null', language="java")).text == "true"
    assert ok(sbx.run_code('System.getProperty("user.dir")', language="java")).text == "/home/user"
    ctx = sbx.create_code_context(cwd="/tmp", language="java")
    assert ok(sbx.run_code('System.getProperty("user.dir")', context=ctx)).text == "/tmp"
    assert ok(sbx.run_code('new java.io.File("rel.txt").getAbsolutePath()', context=ctx)).text == "/tmp/rel.txt"


def test_sandbox_env_vars_reach_r_and_java(sandbox_factory):
    s = sandbox_factory(envs={"BH_GLOBAL": "g"})
    assert texts(ok(s.run_code("Sys.getenv('BH_GLOBAL')", language="r"))) == ['[1] "g"']
    assert ok(s.run_code('System.getenv("BH_GLOBAL")', language="java")).text == "g"
