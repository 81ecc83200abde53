"""README.md's quick-start code, run as a user would run it: the fenced blocks of a section,
unchanged, in a fresh interpreter (Python) or Node.js process (JS) that has only the SDK and the
E2B_* environment. A README edit that breaks a quick start fails the suites that call this.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
JS_SDK_DIR = REPO / "tests" / "sdk" / "js"


def blocks(section: str, language: str) -> list[str]:
    """The fenced `language` blocks under the heading named `section` (up to the next heading
    of the same or a higher level)."""
    text = README.read_text()
    head = re.search(rf"^(#+) {re.escape(section)}\s*$", text, re.M)
    if head is None:
        raise AssertionError(f"README.md has no heading '{section}'")
    level = len(head.group(1))
    rest = text[head.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    body = rest[: end.start()] if end else rest
    found = re.findall(rf"^```{language}\n(.*?)^```", body, re.M | re.S)
    if not found:
        raise AssertionError(f"README.md's '{section}' has no ```{language} block")
    return found


def run_python(code: str, timeout: float, server=None) -> str:
    """Run `code` with this interpreter (the test venv: the SDKs and nothing of the tests),
    against `server` (a BulkheadServer) or the one the E2B_* variables name."""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_env(server), cwd="/"
    )
    assert r.returncode == 0, f"the README's Python block failed:\n{code}\nstderr:\n{r.stderr[-3000:]}"
    return r.stdout


def run_js(code: str, timeout: float, server=None) -> str:
    """Run `code` as an ES module next to tests/sdk/js/node_modules (the npm `e2b` SDK)."""
    with tempfile.NamedTemporaryFile("w", suffix=".mjs", dir=JS_SDK_DIR, prefix=".readme-") as f:
        f.write(code)
        f.flush()
        r = subprocess.run(["node", f.name], capture_output=True, text=True, timeout=timeout, env=_env(server), cwd="/")
    assert r.returncode == 0, f"the README's JS block failed:\n{code}\nstderr:\n{r.stderr[-3000:]}"
    return r.stdout


def check_quick_start(out: str) -> None:
    """What the "Quick start" blocks print (Python and JS print the same)."""
    assert out.splitlines() == ["hello from user", "", "42", ""], out


def check_code_interpreter(out: str) -> None:
    """What the "Code interpreter" block prints: a sum, a chart with its PNG, JS, an SQL table."""
    lines = out.splitlines()
    assert lines[0] == "6", out
    assert lines[1].startswith("ChartType.LINE iVBORw0KGgo"), out
    assert lines[2] == "42", out
    sql = "\n".join(lines[3:])
    assert "answer" in sql and "42" in sql, out


def _env(server=None) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "NO_PROXY", "no_proxy")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    if server is not None:
        env.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=server.api_key)
    return env
