"""Pause and resume of a code-interpreter sandbox through the official SDK: the Jupyter kernel
(its variables and a pandas DataFrame) is restored with its memory, and runs code afterwards;
a fork gets a copy of the kernel."""

from __future__ import annotations

from e2b_code_interpreter import Sandbox


def test_kernel_variables_and_dataframe_survive_pause_and_resume(sandbox_factory):
    sbx = sandbox_factory()
    r = sbx.run_code(
        "import pandas as pd\n"
        "secret = 6 * 7\n"
        "df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\n"
        "secret"
    )
    assert r.error is None, r.error
    assert r.text == "42"

    assert sbx.pause() is True
    assert Sandbox.get_info(sbx.sandbox_id).state == "paused"
    again = Sandbox.connect(sbx.sandbox_id)

    r = again.run_code("secret + 1")
    assert r.error is None, r.error
    assert r.text == "43", "the kernel's variable survived the pause"
    r = again.run_code("int(df['a'].sum()), list(df['b'])")
    assert r.error is None, r.error
    assert r.text == "(6, ['x', 'y', 'z'])"
    r = again.run_code("df")
    assert r.results[0].data == {"a": [1, 2, 3], "b": ["x", "y", "z"]}
    # New work after the resume.
    r = again.run_code("df2 = df.assign(c=df['a'] * 10)\nint(df2['c'].sum())")
    assert r.error is None, r.error
    assert r.text == "60"


def test_a_fork_has_a_copy_of_the_kernel(sandbox_factory):
    parent = sandbox_factory()
    assert parent.run_code("import pandas as pd\nn = 5\ndf = pd.DataFrame({'v': [n]})").error is None
    forks = parent.fork(count=1, timeout=300)
    try:
        (fork,) = forks
        assert not isinstance(fork, Exception), fork
        assert fork.run_code("n = n + 1\nn").text == "6"
        assert fork.run_code("int(df['v'][0])").text == "5"
        assert parent.run_code("n").text == "5", "the fork's kernel is a copy"
    finally:
        for f in forks:
            if not isinstance(f, Exception):
                try:
                    f.kill()
                except Exception:
                    pass
