"""Fresh sandboxes, one after the other (warm-pool and cold starts alike): right after
`Sandbox.create()` returns, the default python and javascript contexts exist (E2B creates them
before the sandbox is reported ready) and the first `run_code` in each works."""

from __future__ import annotations


def test_fresh_sandboxes_have_default_contexts_and_run(sandbox_factory):
    problems = []
    for i in range(6):
        sbx = sandbox_factory()
        langs = sorted(c.language for c in sbx.list_code_contexts())
        if not {"python", "javascript"} <= set(langs):
            problems.append(f"sandbox {i}: contexts right after create: {langs}")
        try:
            r = sbx.run_code("1+1", timeout=60)
            if r.text != "2" or r.error is not None:
                problems.append(f"sandbox {i}: first run_code gave {r.text!r} {r.error}")
        except Exception as e:  # noqa: BLE001 - collect every sandbox's failure, then report
            problems.append(f"sandbox {i}: first run_code raised {str(e).splitlines()[0][:300]}")
        r = sbx.run_code("1+1", language="javascript", timeout=60)
        if r.text != "2":
            problems.append(f"sandbox {i}: first javascript run_code gave {r.text!r} {r.error}")
        sbx.kill()
    assert not problems, "\n".join(problems)
