"""README.md's "Quick start" blocks (Python and JS), unchanged, against the session's server,
each in a fresh process that has only the SDK and the E2B_* variables (see readme_blocks.py)."""

from __future__ import annotations

import readme_blocks


def test_python_quick_start():
    out = readme_blocks.run_python(readme_blocks.blocks("Quick start", "python")[0], timeout=120)
    readme_blocks.check_quick_start(out)


def test_js_quick_start():
    out = readme_blocks.run_js(readme_blocks.blocks("Quick start", "js")[0], timeout=120)
    readme_blocks.check_quick_start(out)
