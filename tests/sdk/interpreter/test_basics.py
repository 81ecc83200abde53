"""run_code basics through the official `e2b-code-interpreter` SDK: state, results, streaming,
errors, IPython magics and shell escapes."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from _interp import ndjson, parse_iso, plain, raw


def test_default_template_is_code_interpreter(shared):
    # The SDK's own default template id, nothing passed by the test.
    from e2b_code_interpreter import Sandbox

    assert Sandbox.default_template == "code-interpreter-v1"
    info = shared.get_info()
    assert info.template_id in ("code-interpreter-v1",) or info.name == "code-interpreter-v1", info


def test_state_kept_across_calls(shared):
    r1 = shared.run_code("x = 41\ndef inc(v):\n    return v + 1\nimport math")
    assert r1.error is None and r1.results == []
    r2 = shared.run_code("inc(x)")
    assert r2.error is None
    assert r2.text == "42"
    assert len(r2.results) == 1 and r2.results[0].is_main_result is True
    r3 = shared.run_code("x += 1\nmath.floor(x / 2)")
    assert r3.text == "21"
    assert shared.run_code("x").text == "42"


def test_text_result_forms(shared):
    # text/plain of a str repr has its surrounding quotes stripped by the server.
    assert shared.run_code("'hello'").text == "hello"
    assert shared.run_code('"double"').text == "double"
    assert shared.run_code("[1, 'a', None]").text == "[1, 'a', None]"
    # A statement (or a trailing `;`) has no main result.
    r = shared.run_code("y = 3")
    assert r.results == [] and r.text is None
    r = shared.run_code("y;")
    assert r.results == []


def test_execution_count_increments(shared):
    a = shared.run_code("1")
    b = shared.run_code("2")
    assert isinstance(a.execution_count, int) and a.execution_count >= 1
    assert b.execution_count == a.execution_count + 1


def test_stdout_stderr_logs(shared):
    r = shared.run_code("import sys\nprint('out1')\nprint('err1', file=sys.stderr)\nprint('out2')\n'done'")
    assert "".join(r.logs.stdout) == "out1\nout2\n"
    assert "".join(r.logs.stderr) == "err1\n"
    assert r.text == "done"


def test_unicode_and_large_output(shared):
    r = shared.run_code("print('héllo wörld ✓ 日本')\nprint('z' * 200000)")
    out = "".join(r.logs.stdout)
    assert out.startswith("héllo wörld ✓ 日本\n")
    assert out.count("z") == 200000


def test_streaming_callbacks_arrive_while_cell_runs(shared):
    events = []
    t0 = time.monotonic()

    def on_out(msg):
        events.append(("out", msg.line, msg.error, time.monotonic() - t0))

    def on_err(msg):
        events.append(("err", msg.line, msg.error, time.monotonic() - t0))

    results = []
    r = shared.run_code(
        "import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('oops', file=sys.stderr, flush=True)\n"
        "time.sleep(1.0)\n"
        "print('second')\n"
        "7 * 6",
        on_stdout=on_out,
        on_stderr=on_err,
        on_result=results.append,
    )
    done = time.monotonic() - t0
    assert [(k, line, e) for k, line, e, _ in events] == [
        ("out", "first\n", False),
        ("err", "oops\n", True),
        ("out", "second\n", False),
    ], events
    first_at = events[0][3]
    err_at = events[1][3]
    # Streamed, not buffered until the end: the first line arrives ~2.5 s before the cell ends.
    assert done - first_at >= 2.0, f"first stdout at {first_at:.2f}s, cell done at {done:.2f}s"
    assert done - err_at >= 0.7, f"stderr at {err_at:.2f}s, cell done at {done:.2f}s"
    assert [x.text for x in results] == ["42"]
    assert r.text == "42"


def test_stream_message_timestamps(shared):
    seen = []
    shared.run_code("print('a')", on_stdout=seen.append)
    assert len(seen) == 1 and seen[0].line == "a\n"
    # The wire carries an ISO-8601 timestamp of when the kernel produced the line.
    ts = parse_iso(seen[0].timestamp)
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert abs((now - ts).total_seconds()) < 120, (ts, now)


def test_error_name_value_traceback(shared):
    r = shared.run_code("print('before')\nraise ValueError('bad value 42')\nprint('after')")
    assert r.error is not None
    assert r.error.name == "ValueError"
    assert r.error.value == "bad value 42"
    tb = plain(r.error.traceback)
    assert "ValueError" in tb and "bad value 42" in tb
    assert "raise ValueError('bad value 42')" in tb, tb
    assert "".join(r.logs.stdout) == "before\n"
    assert r.results == []

    errs = []
    r = shared.run_code("1/0", on_error=errs.append)
    assert r.error.name == "ZeroDivisionError"
    assert r.error.value == "division by zero"
    assert len(errs) == 1 and errs[0].name == "ZeroDivisionError"

    r = shared.run_code("undefined_name_xyz")
    assert r.error.name == "NameError"
    assert "undefined_name_xyz" in r.error.value

    r = shared.run_code("def f(:\n  pass")
    assert r.error.name == "SyntaxError"
    # The kernel is fine afterwards and the state survived.
    shared.run_code("survivor = 'still here'")
    assert shared.run_code("survivor").text == "still here"


def test_display_results_and_main_result(shared):
    r = shared.run_code(
        "from IPython.display import display, HTML, Markdown, JSON, Latex, SVG\n"
        "display('first')\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(Markdown('# Title'))\n"
        "display(JSON({'k': [1, 2], 'n': None}))\n"
        "display(Latex(r'$x^2$'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"2\" height=\"2\"><rect width=\"1\" height=\"1\"/></svg>'))\n"
        "3 + 4"
    )
    assert r.error is None, r.error
    assert len(r.results) == 7, [x.formats() for x in r.results]
    first, html, md, js, latex, svg, main = r.results
    assert first.text == "first" and first.is_main_result is False
    assert html.html == "<b>bold</b>"
    assert md.markdown == "# Title"
    assert js.json == {"k": [1, 2], "n": None}
    assert latex.latex == "$x^2$"
    assert svg.svg.startswith("<svg") and '<rect height="1" width="1"/>' in svg.svg.replace('width="1" height="1"', 'height="1" width="1"'), svg.svg
    assert main.is_main_result is True and main.text == "7"
    assert [x.is_main_result for x in r.results].count(True) == 1
    assert r.text == "7"


def test_custom_repr_object(shared):
    r = shared.run_code(
        "class Card:\n"
        "    def _repr_html_(self):\n"
        "        return '<div>card</div>'\n"
        "    def _repr_markdown_(self):\n"
        "        return '**card**'\n"
        "    def __repr__(self):\n"
        "        return 'Card()'\n"
        "Card()"
    )
    assert r.error is None
    (res,) = r.results
    assert res.is_main_result
    assert res.text == "Card()"
    assert res.html == "<div>card</div>"
    assert res.markdown == "**card**"
    assert set(res.formats()) >= {"html", "markdown"}


def test_uniformly_indented_code_is_dedented(shared):
    r = shared.run_code("\n    a_ind = 20\n    b_ind = 22\n    a_ind + b_ind\n")
    assert r.error is None, r.error
    assert r.text == "42"


def test_shell_escape_pip_version(shared):
    r = shared.run_code("!pip --version")
    assert r.error is None, r.error
    out = "".join(r.logs.stdout)
    assert out.startswith("pip "), out
    assert "python 3" in out, out


def test_shell_escape_captures_and_runs_as_user(shared):
    r = shared.run_code("who = !whoami\nhome = !echo $HOME\n(who[0], home[0])")
    assert r.error is None, r.error
    assert r.text == "('user', '/home/user')"


def test_magics(shared):
    r = shared.run_code("%pwd")
    assert r.text == "/home/user"
    r = shared.run_code("%%bash\necho from-bash $((6*7))")
    assert r.error is None, r.error
    assert "".join(r.logs.stdout) == "from-bash 42\n"
    r = shared.run_code("%cd /tmp")
    assert r.error is None
    assert shared.run_code("import os; os.getcwd()").text == "/tmp"
    shared.run_code("%cd /home/user")
    assert shared.run_code("%pwd").text == "/home/user"
    r = shared.run_code("%timeit -n1 -r1 sum(range(10))")
    assert r.error is None and "loop" in "".join(r.logs.stdout)


def test_kernel_identity(shared):
    r = shared.run_code(
        "import os, sys, pwd\n(pwd.getpwuid(os.getuid()).pw_name, os.environ.get('HOME'), sys.version_info[0])"
    )
    assert r.text == "('user', '/home/user', 3)"


def test_preinstalled_packages(shared):
    r = shared.run_code(
        "import numpy, pandas, matplotlib, scipy, seaborn, openpyxl, PIL, requests\n"
        "import numpy as np\n"
        "float(np.array([1.5, 2.5]).sum())"
    )
    assert r.error is None, r.error
    assert r.text == "4.0"


def test_pip_install_as_user_is_allowed(shared):
    # Debian's EXTERNALLY-MANAGED marker is removed in the template, so pip does not refuse.
    r = shared.run_code("!pip install --no-index --dry-run pip 2>&1 | head -5")
    out = "".join(r.logs.stdout)
    assert "externally-managed-environment" not in out, out
    assert "Requirement already satisfied: pip" in out, out


def test_raw_wire_ndjson(shared):
    """The stream itself: NDJSON lines, types and the terminating `end_of_execution`."""
    r = raw(shared, "POST", "/execute", {"code": "print('w')\n5", "context_id": None, "language": None, "env_vars": None})
    assert r.status == 200, r.body[:300]
    lines = ndjson(r.body)
    kinds = [x["type"] for x in lines if x["type"] != "keepalive"]
    assert kinds[-1] == "end_of_execution"
    assert "number_of_executions" in kinds
    out = [x for x in lines if x["type"] == "stdout"]
    # ipykernel may flush `print`'s text and its newline apart (its flush timer): one or more
    # stdout lines, in order, each with its timestamp.
    assert "".join(x["text"] for x in out) == "w\n", out
    assert all(x["timestamp"] for x in out)
    res = [x for x in lines if x["type"] == "result"]
    assert len(res) == 1 and res[0]["text"] == "5" and res[0]["is_main_result"] is True
    # null fields are omitted, not sent as null
    assert all(v is not None for v in res[0].values())


def test_raw_health(shared):
    r = raw(shared, "GET", "/health", token=False)
    assert r.status == 200
    assert r.body.decode().strip().strip('"') == "OK"
