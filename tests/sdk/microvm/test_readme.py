"""README.md's quick starts, unchanged, against the microvm server (issue 10's "done when"): the
Python and JS blocks of "Quick start" and the Python block of "Code interpreter", each in a fresh
process that has only the SDK and the E2B_* variables. Every sandbox they create is a microVM
(`--driver-for base=microvm,code-interpreter-v1=microvm`), and each block kills its own.
"""

from __future__ import annotations

import pytest

import readme_blocks


def _no_guest_leftovers(server):
    from e2b import Sandbox

    left = Sandbox.list().next_items()
    # The suite's other tests tag their sandboxes; the README's blocks create untagged ones.
    return [s.sandbox_id for s in left if not (s.metadata or {}).get("bulkhead-test")]


@pytest.mark.timeout(600)
def test_python_quick_start(server):
    out = readme_blocks.run_python(readme_blocks.blocks("Quick start", "python")[0], timeout=500)
    readme_blocks.check_quick_start(out)
    assert _no_guest_leftovers(server) == []


@pytest.mark.timeout(600)
def test_js_quick_start(server):
    out = readme_blocks.run_js(readme_blocks.blocks("Quick start", "js")[0], timeout=500)
    readme_blocks.check_quick_start(out)
    assert _no_guest_leftovers(server) == []


@pytest.mark.timeout(900)
def test_code_interpreter_quick_start(server):
    out = readme_blocks.run_python(readme_blocks.blocks("Code interpreter", "python")[0], timeout=800)
    readme_blocks.check_code_interpreter(out)
    assert _no_guest_leftovers(server) == []
