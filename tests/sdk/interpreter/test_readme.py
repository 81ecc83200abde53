"""README.md's "Code interpreter" block, unchanged, against the session's server, in a fresh
process that has only the SDK and the E2B_* variables (see readme_blocks.py)."""

from __future__ import annotations

import readme_blocks


def test_code_interpreter_quick_start():
    out = readme_blocks.run_python(readme_blocks.blocks("Code interpreter", "python")[0], timeout=300)
    readme_blocks.check_code_interpreter(out)
